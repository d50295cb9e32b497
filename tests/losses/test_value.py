"""Tests for shoal.losses.value against hand-computed values."""

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from shoal.losses import clipped_value_loss, huber_loss, value_loss


def test_value_loss():
    values = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    returns = torch.tensor([2.0, 2.0, 5.0])
    loss = value_loss(values, returns)
    # errors [-1, 0, -2] -> 0.5 * (1 + 0 + 4) / 3
    assert_close(loss, torch.tensor(5.0 / 6.0))
    loss.backward()
    # d/dv 0.5 * mean(e^2) = e / n
    assert_close(values.grad, torch.tensor([-1.0, 0.0, -2.0]) / 3)


def test_clipped_value_loss():
    old_values = torch.zeros(4)
    values = torch.tensor([1.0, -0.1, 0.3, -1.0], requires_grad=True)
    returns = torch.tensor([0.0, 1.0, 0.0, -2.0])
    loss = clipped_value_loss(values, old_values, returns, clip=0.2)
    # v_clipped        = [0.2, -0.1, 0.2, -0.2]
    # (v - R)^2        = [1.0, 1.21, 0.09, 1.0]
    # (v_clipped - R)^2 = [0.04, 1.21, 0.04, 3.24]
    # max              = [1.0, 1.21, 0.09, 3.24] -> 0.5 * 5.54 / 4
    assert_close(loss, torch.tensor(0.6925))
    loss.backward()
    # Samples 0-2 take the unclipped branch: grad (v - R) / 4. Sample 3 takes the clipped branch,
    # whose value is outside the clip range, so it gets no gradient.
    assert_close(values.grad, torch.tensor([1.0 / 4, -1.1 / 4, 0.3 / 4, 0.0]))


def test_clipped_value_loss_without_clipping_is_value_loss():
    g = torch.Generator().manual_seed(0)
    old_values = torch.randn(32, generator=g)
    returns = torch.randn(32, generator=g)
    values = old_values + 0.01 * torch.randn(32, generator=g)
    assert_close(
        clipped_value_loss(values, old_values, returns, clip=0.5), value_loss(values, returns)
    )


@pytest.mark.parametrize(
    ("delta", "expected"),
    [
        # errors [0.5, -2, 3, 1]: 0.5 * 0.25, 1 * (2 - 0.5), 1 * (3 - 0.5), 0.5 * 1
        (1.0, (0.125 + 1.5 + 2.5 + 0.5) / 4),  # 1.15625
        # delta 2: 0.5 * 0.25, 0.5 * 4, 2 * (3 - 1), 0.5 * 1
        (2.0, (0.125 + 2.0 + 4.0 + 0.5) / 4),  # 1.65625
    ],
)
def test_huber_loss(delta, expected):
    pred = torch.zeros(4, requires_grad=True)
    target = torch.tensor([0.5, -2.0, 3.0, 1.0])
    loss = huber_loss(pred, target, delta)
    assert_close(loss, torch.tensor(expected))
    assert_close(loss, F.huber_loss(pred, target, delta=delta))
    loss.backward()
    # Gradient is the error clipped to [-delta, delta], divided by n.
    assert_close(pred.grad, -torch.clamp(target, -delta, delta) / 4)


def test_huber_loss_default_delta():
    pred = torch.tensor([0.0, 0.0])
    target = torch.tensor([0.5, 3.0])
    assert_close(huber_loss(pred, target), torch.tensor((0.125 + 2.5) / 2))
