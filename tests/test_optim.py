"""`shoal.optim.minimize`, the one optimizer step: it refuses non-finite losses and gradients
by name before anything changes, clips, and its two halves (`gradients`, `apply_gradients`)
make the same step."""

import copy
import math

import pytest
import torch

from shoal.core.errors import NaNLossError
from shoal.optim import (
    RMSpropTF,
    apply_gradients,
    build_optimizer,
    check_finite,
    gradients,
    minimize,
)


def net_and_optimizer(seed: int = 0):
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    return net, torch.optim.Adam(net.parameters(), lr=0.1)


def losses_of(net, x: torch.Tensor) -> dict[str, torch.Tensor]:
    out = net(x).squeeze(-1)
    losses = {"fit": (out - 1.0).pow(2).mean(), "small": 0.1 * out.pow(2).mean()}
    losses["total"] = losses["fit"] + losses["small"]
    return losses


def weights(net) -> list[torch.Tensor]:
    return [p.detach().clone() for p in net.parameters()]


def test_minimize_takes_adams_step_and_returns_the_norm_before_clipping():
    x = torch.randn(16, 3, generator=torch.Generator().manual_seed(1))
    net, opt = net_and_optimizer()
    ref, ref_opt = net_and_optimizer()
    norm = minimize(losses_of(net, x), opt, max_grad_norm=0.05)
    ref_opt.zero_grad()
    losses_of(ref, x)["total"].backward()
    expected = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.05)
    ref_opt.step()
    assert float(norm) == pytest.approx(float(expected))
    for a, b in zip(weights(net), weights(ref), strict=True):
        torch.testing.assert_close(a, b)
    assert minimize(losses_of(net, x), opt) is None  # no clipping: no norm


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_minimize_names_the_non_finite_loss_and_changes_nothing(bad):
    net, opt = net_and_optimizer()
    before = weights(net)
    losses = losses_of(net, torch.randn(4, 3))
    losses["small"] = losses["small"] * bad
    losses["total"] = losses["fit"] + losses["small"]
    with pytest.raises(NaNLossError, match=rf"loss/small became {bad}; weights left unchanged"):
        minimize(losses, opt, 1.0)
    for a, b in zip(weights(net), before, strict=True):
        torch.testing.assert_close(a, b)
    assert all(p.grad is None for p in net.parameters())  # not even a backward pass


def test_a_single_loss_needs_no_total_and_floats_are_checked_too():
    net, opt = net_and_optimizer()
    loss = (net(torch.randn(4, 3)) ** 2).mean()
    minimize({"td": loss}, opt)
    with pytest.raises(NaNLossError, match="loss/td became nan"):
        minimize({"td": loss.detach() * math.nan}, opt)
    with pytest.raises(NaNLossError, match="loss/value became inf"):
        check_finite({"policy": 0.5, "value": math.inf, "total": math.inf})


def test_a_non_finite_gradient_stops_before_the_step():
    net, opt = net_and_optimizer()
    before = weights(net)
    # A finite loss with an infinite gradient: d sqrt(u) / du is inf at u = 0.
    loss = torch.sqrt(net(torch.randn(4, 3)).abs() * 0.0).sum()
    with pytest.raises(NaNLossError, match="gradient norm became"):
        minimize({"loss": loss}, opt, max_grad_norm=1.0)
    for a, b in zip(weights(net), before, strict=True):
        torch.testing.assert_close(a, b)


def test_clip_groups_clip_each_group_separately():
    net, opt = net_and_optimizer()
    first, second = list(net[0].parameters()), list(net[2].parameters())
    x = torch.randn(8, 3)
    minimize(losses_of(net, x), opt, 1e-3, clip_groups=(first, second))
    for group in (first, second):
        norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in group]))
        assert float(norm) == pytest.approx(1e-3, rel=1e-3)


def test_the_two_halves_make_the_same_step_across_copies():
    """A3C's split: a worker's gradient, applied to the driver's copy of the weights."""
    x = torch.randn(8, 3, generator=torch.Generator().manual_seed(2))
    worker, _ = net_and_optimizer()
    driver, driver_opt = net_and_optimizer()
    reference, reference_opt = net_and_optimizer()
    gradients(losses_of(worker, x), list(worker.parameters()), 0.5)
    for param, source in zip(driver.parameters(), worker.parameters(), strict=True):
        param.grad = source.grad.clone()
    apply_gradients(driver_opt)
    minimize(losses_of(reference, x), reference_opt, 0.5)
    for a, b in zip(weights(driver), weights(reference), strict=True):
        torch.testing.assert_close(a, b)


def test_before_clip_sees_the_gradients():
    net, opt = net_and_optimizer()
    seen = []
    minimize(
        losses_of(net, torch.randn(4, 3)),
        opt,
        before_clip=lambda: seen.append(all(p.grad is not None for p in net.parameters())),
    )
    assert seen == [True]


def test_rmsprop_tf_steps_match_hand_computed_values():
    """Two steps of TensorFlow-form RMSprop on one parameter, by hand: v starts at 1 and
    epsilon sits inside the square root (Mnih et al. 2016's rule)."""
    p = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    opt = build_optimizer([p], "rmsprop-tf", lr=0.1, eps=0.01, alpha=0.9)
    assert isinstance(opt, RMSpropTF)
    p.grad = torch.tensor([2.0, 0.0])
    opt.step()
    # v = 0.9 * 1 + 0.1 * g^2 = [1.3, 0.9]; step = 0.1 * g / sqrt(v + 0.01)
    assert p.detach().tolist() == pytest.approx([1.0 - 0.2 / math.sqrt(1.31), -2.0])
    p.grad = torch.tensor([-1.0, 1.0])
    opt.step()
    v = [0.9 * 1.3 + 0.1 * 1.0, 0.9 * 0.9 + 0.1 * 1.0]
    expected = [
        1.0 - 0.2 / math.sqrt(1.31) + 0.1 / math.sqrt(v[0] + 0.01),
        -2.0 - 0.1 / math.sqrt(v[1] + 0.01),
    ]
    assert p.detach().tolist() == pytest.approx(expected)


def test_rmsprop_tf_weight_decay_and_momentum_by_hand():
    p = torch.nn.Parameter(torch.tensor([2.0]))
    opt = build_optimizer([p], "rmsprop-tf", lr=0.5, eps=0.0, weight_decay=0.25, alpha=0.5,
                          momentum=0.5)  # fmt: skip
    for _ in range(2):
        p.grad = torch.tensor([1.0])
        opt.step()
    # step 1: g = 1 + 0.25 * 2 = 1.5, v = 0.5 + 0.5 * 2.25 = 1.625, b = 1.5 / sqrt(1.625)
    b1 = 1.5 / math.sqrt(1.625)
    p1 = 2.0 - 0.5 * b1
    # step 2: g = 1 + 0.25 * p1, v = 0.5 * 1.625 + 0.5 g^2, b = 0.5 b1 + g / sqrt(v)
    g2 = 1.0 + 0.25 * p1
    b2 = 0.5 * b1 + g2 / math.sqrt(0.5 * 1.625 + 0.5 * g2 * g2)
    assert p.item() == pytest.approx(p1 - 0.5 * b2)


def test_rmsprop_tf_first_steps_are_small_where_pytorchs_are_sign_like():
    """The reason rmsprop-tf exists: on a tiny gradient PyTorch's RMSprop (average from 0,
    epsilon outside the root) steps about lr / sqrt(1 - alpha) = 10 lr; the TF form steps
    about lr * |g|."""
    steps = {}
    for kind in ("rmsprop", "rmsprop-tf"):
        p = torch.nn.Parameter(torch.zeros(1))
        opt = build_optimizer([p], kind, lr=1e-3, eps=1e-5, alpha=0.99)
        p.grad = torch.tensor([1e-2])
        opt.step()
        steps[kind] = -float(p)
    assert steps["rmsprop"] == pytest.approx(1e-2, rel=1e-2)
    assert steps["rmsprop-tf"] == pytest.approx(1e-5, rel=1e-2)


def test_rmsprop_tf_refuses_bad_settings():
    with pytest.raises(ValueError, match="alpha"):
        build_optimizer([torch.nn.Parameter(torch.zeros(1))], "rmsprop-tf", lr=0.1, eps=0.0,
                        alpha=1.0)  # fmt: skip


def test_rmsprop_tf_resumes_exactly_from_its_state_dict():
    torch.manual_seed(0)
    net = torch.nn.Linear(3, 2)
    opt = build_optimizer(net.parameters(), "rmsprop-tf", lr=0.01, eps=1e-5, momentum=0.9)
    x = torch.randn(8, 3)
    for _ in range(3):
        minimize({"total": net(x).pow(2).mean()}, opt)
    twin = torch.nn.Linear(3, 2)
    twin.load_state_dict(net.state_dict())
    twin_opt = build_optimizer(twin.parameters(), "rmsprop-tf", lr=0.01, eps=1e-5, momentum=0.9)
    twin_opt.load_state_dict(copy.deepcopy(opt.state_dict()))  # as read from a checkpoint file
    for model, optimizer in ((net, opt), (twin, twin_opt)):
        minimize({"total": model(x).pow(2).mean()}, optimizer)
    for a, b in zip(net.parameters(), twin.parameters(), strict=True):
        assert torch.equal(a, b)
