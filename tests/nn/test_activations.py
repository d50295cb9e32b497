"""The fast tanh must be a drop-in replacement for torch.tanh: values and gradients."""

import pytest
import torch

from shoal.nn.activations import ACTIVATIONS, Tanh, tanh


def test_tanh_matches_torch_values_on_cpu_float32():
    x = torch.linspace(-20, 20, 4001).reshape(1, -1) * torch.ones(3, 1)
    torch.testing.assert_close(tanh(x), torch.tanh(x), atol=2e-7, rtol=0)


def test_tanh_gradient_matches_torch_on_non_contiguous_input():
    base = torch.randn(6, 8, dtype=torch.float32) * 3
    ours = base.clone().requires_grad_()
    ref = base.clone().requires_grad_()
    weights = torch.randn(8, 3)
    (tanh(ours.T[:, ::2]) * weights).sum().backward()
    (torch.tanh(ref.T[:, ::2]) * weights).sum().backward()
    torch.testing.assert_close(ours.grad, ref.grad, atol=1e-6, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16])
def test_other_dtypes_fall_back_to_torch(dtype):
    x = torch.randn(5, dtype=dtype)
    assert tanh(x).dtype == dtype
    torch.testing.assert_close(tanh(x), torch.tanh(x))


def test_inference_mode_and_no_grad():
    x = torch.randn(4, 4)
    with torch.inference_mode():
        y = tanh(x)
    assert not y.requires_grad
    torch.testing.assert_close(y, torch.tanh(x), atol=2e-7, rtol=0)


def test_registry_names():
    assert set(ACTIVATIONS) == {"tanh", "relu", "silu", "elu"}
    assert ACTIVATIONS["tanh"] is tanh
    assert isinstance(Tanh()(torch.zeros(2)), torch.Tensor)
