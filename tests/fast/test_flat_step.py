"""`optimizer_step` and `FlatStep` (the fast path's NumPy step) take the same steps as
``optimizer.step()``."""

import copy

import pytest
import torch

from shoal.fast.flat_step import FlatStep
from shoal.optim import optimizer_step

SHAPES = [(3, 4), (4,), (2, 1, 4), (1,)]

OPTIMIZERS = {
    "adam": lambda p: torch.optim.Adam(p, lr=1e-2, eps=1e-5),
    "adam with L2": lambda p: torch.optim.Adam(p, lr=1e-2, weight_decay=0.1),
    "adamw fused": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1, fused=True),
    "adamw foreach": lambda p: torch.optim.AdamW(p, lr=3e-3, betas=(0.8, 0.9), foreach=True),
    "rmsprop": lambda p: torch.optim.RMSprop(p, lr=1e-2, alpha=0.9, eps=1e-5, foreach=True),
    "rmsprop with L2": lambda p: torch.optim.RMSprop(p, lr=1e-2, weight_decay=0.1),
}


def flat_params(seed):
    """Parameters that are views of one flat buffer, and their gradients of another."""
    g = torch.Generator().manual_seed(seed)
    sizes = [torch.Size(s).numel() for s in SHAPES]
    flat = torch.randn(sum(sizes), generator=g)
    flat_grad = torch.zeros_like(flat)
    params, offset = [], 0
    for shape, size in zip(SHAPES, sizes, strict=True):
        param = torch.nn.Parameter(flat[offset : offset + size].view(shape))
        param.grad = flat_grad[offset : offset + size].view(shape)
        params.append(param)
        offset += size
    return flat, flat_grad, params


def set_gradients(flat_grad, step):
    g = torch.Generator().manual_seed(100 + step)
    flat_grad.copy_(torch.randn(flat_grad.shape, generator=g))


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_flat_step_and_functional_step_equal_optimizer_step(name):
    reference_flat, reference_grad, reference = flat_params(0)
    flat, flat_grad, params = flat_params(0)
    functional_flat, functional_grad, functional = flat_params(0)
    reference_opt = OPTIMIZERS[name](reference)
    opt = OPTIMIZERS[name](params)
    functional_opt = OPTIMIZERS[name](functional)
    stepper = FlatStep(opt, flat.detach(), flat_grad)
    assert stepper.supported()
    for step in range(5):
        for grad in (reference_grad, flat_grad, functional_grad):
            set_gradients(grad, step)
        reference_opt.step()
        stepper.step()
        optimizer_step(functional_opt)
        torch.testing.assert_close(flat, reference_flat, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(functional_flat, reference_flat, rtol=1e-5, atol=1e-6)
    # The optimizer's own state is the flat state: it saves and reloads as usual.
    for saved, expected in zip(
        opt.state_dict()["state"].values(),
        reference_opt.state_dict()["state"].values(),
        strict=True,
    ):
        for key, value in expected.items():
            torch.testing.assert_close(saved[key], value, rtol=1e-5, atol=1e-6)


def test_flat_step_follows_a_reloaded_optimizer():
    flat, flat_grad, params = flat_params(0)
    opt = torch.optim.AdamW(params, lr=1e-2, fused=True)
    stepper = FlatStep(opt, flat.detach(), flat_grad)
    set_gradients(flat_grad, 0)
    stepper.step()  # the first step creates the state through optimizer.step()
    stepper.step()
    saved = copy.deepcopy(opt.state_dict())  # as from a checkpoint: tensors of its own
    reference_flat, reference_grad, reference = flat_params(0)
    reference_flat.detach().copy_(flat.detach())
    reference_opt = torch.optim.AdamW(reference, lr=1e-2, fused=True)
    reference_opt.load_state_dict(copy.deepcopy(saved))
    opt.load_state_dict(saved)  # new state tensors: the stepper flattens them again
    set_gradients(flat_grad, 1)
    set_gradients(reference_grad, 1)
    stepper.step()
    reference_opt.step()
    torch.testing.assert_close(flat, reference_flat, rtol=1e-5, atol=1e-6)
    assert all(float(s["step"]) == 3 for s in opt.state.values())


def test_unsupported_options_take_the_optimizers_own_step():
    flat, flat_grad, params = flat_params(0)
    for opt in (
        torch.optim.Adam(params, amsgrad=True),
        torch.optim.RMSprop(params, momentum=0.9),
        torch.optim.SGD(params, lr=0.1),
    ):
        assert not FlatStep(opt, flat.detach(), flat_grad).supported()
