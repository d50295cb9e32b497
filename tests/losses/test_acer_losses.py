"""ACER's policy objective (truncation and bias correction) on a two-action example by hand,
and the trust-region projection against its closed form."""

import math

import pytest
import torch
from torch.testing import assert_close

from shoal.losses.acer import acer_policy_objective, trust_region_projection


def _two_action_case():
    # pi = [0.25, 0.75], mu = [0.5, 0.5]; the action taken is 0; Q = [1, 3], so
    # V = 0.25 + 2.25 = 2.5; Q_ret = 2; c = 1.
    logits = torch.log(torch.tensor([[0.25, 0.75]])).requires_grad_(True)
    log_pi = torch.log_softmax(logits, -1)
    pi = log_pi.exp().detach()
    rho = pi / torch.tensor([[0.5, 0.5]])
    q = torch.tensor([[1.0, 3.0]])
    v = (pi * q).sum(-1)
    objective = acer_policy_objective(
        log_pi[:, 0], rho[:, 0], torch.tensor([2.0]) - v,
        log_pi, rho, q - v.unsqueeze(-1), pi, truncation=1.0,
    )  # fmt: skip
    return logits, objective


def test_truncation_and_bias_correction_by_hand():
    logits, objective = _two_action_case()
    # Truncated term: min(1, 0.5) log(0.25) (2 - 2.5); correction: only action 1 has
    # rho = 1.5 > c, weight pi [1 - 1/1.5]_+ = 0.75 / 3, advantage 3 - 2.5.
    expected = 0.5 * math.log(0.25) * -0.5 + 0.75 / 3 * math.log(0.75) * 0.5
    assert_close(objective, torch.tensor([expected]))
    # d log pi(b) / d z = e_b - pi: -0.25 (e_0 - pi) + 0.125 (e_1 - pi) = [-0.21875, 0.21875].
    (grad,) = torch.autograd.grad(objective.sum(), logits)
    assert_close(grad, torch.tensor([[-0.21875, 0.21875]]))


def test_no_correction_when_no_weight_exceeds_the_truncation():
    log_pi = torch.log(torch.tensor([[0.5, 0.5]]))
    rho = torch.tensor([[0.9, 1.1]])
    out = acer_policy_objective(
        log_pi[:, 1], rho[:, 1], torch.tensor([2.0]), log_pi, rho,
        torch.ones(1, 2), torch.full((1, 2), 0.5), truncation=2.0,
    )  # fmt: skip
    # Only the truncated term: min(2, 1.1) * log(0.5) * 2.
    assert_close(out, torch.tensor([1.1 * math.log(0.5) * 2.0]))


def test_trust_region_projection_closed_form():
    g = torch.tensor([[1.0, 0.0], [0.1, 0.1], [2.0, 1.0]])
    k = torch.tensor([[1.0, 1.0], [1.0, 1.0], [0.0, 0.0]])
    z = trust_region_projection(g, k, delta=0.5)
    # Row 0 leaves the region (k.g = 1 > 0.5): z = g - (1 - 0.5) / 2 k = [0.75, -0.25], on its
    # boundary. Row 1 is inside (k.g = 0.2): unchanged. Row 2 has k = 0: unchanged.
    assert_close(z, torch.tensor([[0.75, -0.25], [0.1, 0.1], [2.0, 1.0]]))
    assert_close((k[0] * z[0]).sum(), torch.tensor(0.5))


@pytest.mark.parametrize("seed", range(3))
def test_projection_is_the_closest_point_of_the_half_space(seed):
    # Against a brute-force minimization of ||z - g||^2 subject to k.z <= delta.
    g, k = torch.randn(2, 3, generator=torch.Generator().manual_seed(seed)).unbind(0)
    delta = 0.1
    z = trust_region_projection(g[None], k[None], delta)[0]
    assert (k * z).sum() <= delta + 1e-6
    best = torch.zeros(3, requires_grad=True)
    opt = torch.optim.Adam([best], lr=0.05)
    for _ in range(3000):
        opt.zero_grad()
        penalty = 100.0 * torch.relu((k * best).sum() - delta) ** 2
        ((best - g).square().sum() + penalty).backward()
        opt.step()
    assert_close(z, best.detach(), atol=2e-2, rtol=0)
