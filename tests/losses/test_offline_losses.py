"""The offline losses against hand-computed values."""

import math

import pytest
import torch

from shoal.losses.offline import (
    advantage_weights,
    behaviour_cloning_loss,
    cql_logsumexp,
    cql_penalty,
    expectile_loss,
    lagrange_loss,
    td3_bc_actor_loss,
    weighted_log_likelihood_loss,
)


def test_expectile_loss_weights_each_side_by_hand():
    diff = torch.tensor([2.0, -1.0, 0.5, -3.0])
    # tau 0.7: positive residuals weigh 0.7, negative ones 0.3
    want = (0.7 * 4.0 + 0.3 * 1.0 + 0.7 * 0.25 + 0.3 * 9.0) / 4
    assert expectile_loss(diff, 0.7).item() == pytest.approx(want)
    assert expectile_loss(diff, 0.5).item() == pytest.approx(0.5 * (4 + 1 + 0.25 + 9) / 4)


def test_expectile_regression_finds_the_expectile():
    """Minimizing over a constant v gives the tau-expectile: the mean at 0.5, near the max
    as tau -> 1."""
    q = torch.tensor([0.0, 1.0, 2.0, 10.0])
    for tau, check in ((0.5, lambda v: v == pytest.approx(3.25, abs=1e-3)),
                       (0.99, lambda v: 9.0 < v < 10.0)):  # fmt: skip
        v = torch.zeros((), requires_grad=True)
        opt = torch.optim.SGD([v], lr=0.05)
        for _ in range(3000):
            opt.zero_grad()
            expectile_loss(q - v, tau).backward()
            opt.step()
        assert check(v.item())


def test_advantage_weights_and_weighted_likelihood_by_hand():
    adv = torch.tensor([0.0, 1.0, 5.0], requires_grad=True)
    w = advantage_weights(adv, 2.0, 100.0)
    assert w.tolist() == pytest.approx([1.0, math.exp(2.0), 100.0])
    assert not w.requires_grad
    log_prob = torch.tensor([-1.0, -2.0, -0.5])
    want = -(1.0 * -1.0 + math.exp(2.0) * -2.0 + 100.0 * -0.5) / 3
    assert weighted_log_likelihood_loss(log_prob, w).item() == pytest.approx(want)


def test_cql_logsumexp_discrete_and_sampled_by_hand():
    q = torch.tensor([[1.0, 2.0, 3.0]])
    assert cql_logsumexp(q).item() == pytest.approx(math.log(math.e + math.e**2 + math.e**3))
    # Two samples with densities 0.5 and 0.25: log((e^1 / 0.5 + e^2 / 0.25) / 2)
    sampled = torch.tensor([[1.0, 2.0]])
    log_density = torch.log(torch.tensor([[0.5, 0.25]]))
    want = math.log((math.e / 0.5 + math.e**2 / 0.25) / 2)
    assert cql_logsumexp(sampled, log_density).item() == pytest.approx(want, rel=1e-6)


def test_cql_logsumexp_estimate_converges_to_the_integral():
    """Uniform samples on [-1, 1] (density 1/2) estimate log of the integral of exp(Q)."""
    torch.manual_seed(0)
    a = torch.rand(1, 200_000) * 2 - 1
    q = 3.0 * a  # integral of exp(3a) over [-1, 1] = (e^3 - e^-3) / 3
    estimate = cql_logsumexp(q, torch.full_like(q, math.log(0.5))).item()
    assert estimate == pytest.approx(math.log((math.exp(3) - math.exp(-3)) / 3), abs=0.01)


def test_cql_penalty_sums_critics_and_averages_states():
    soft = torch.tensor([[3.0, 1.0], [2.0, 2.0]])  # [M=2, N=2]
    data = torch.tensor([[1.0, 1.0], [0.0, 1.0]])
    assert cql_penalty(soft, data).item() == pytest.approx((2 + 0) / 2 + (2 + 1) / 2)
    assert cql_penalty(soft[0], data[0]).item() == pytest.approx(1.0)


def test_lagrange_loss_raises_the_weight_while_the_gap_exceeds_the_threshold():
    log_w = torch.zeros((), requires_grad=True)
    lagrange_loss(log_w, torch.tensor(5.0), 2.0).backward()
    assert log_w.grad.item() == pytest.approx(-3.0)  # descent raises log_w
    log_w.grad = None
    lagrange_loss(log_w, torch.tensor(1.0), 2.0).backward()
    assert log_w.grad.item() == pytest.approx(1.0)


def test_td3_bc_actor_loss_normalizes_q_by_hand():
    q = torch.tensor([2.0, -4.0], requires_grad=True)
    pi = torch.tensor([[0.5, 0.0], [0.0, 1.0]])
    data = torch.tensor([[0.0, 0.0], [0.0, 0.0]])
    scale = 2.5 / 3.0  # alpha / mean |Q|
    want = -scale * (-1.0) + (0.25 + 1.0) / 4
    loss = td3_bc_actor_loss(q, pi, data, 2.5)
    assert loss.item() == pytest.approx(want)
    loss.backward()  # lambda carries no gradient: dL/dq = -scale / N
    assert q.grad.tolist() == pytest.approx([-scale / 2, -scale / 2])


def test_td3_bc_actor_loss_takes_the_whole_batchs_mean_abs_q_when_given():
    """A learner group's rank holds some rows of the batch: its lambda is the batch's."""
    q = torch.tensor([2.0, -4.0])
    pi = torch.zeros(2, 2)
    given = td3_bc_actor_loss(q, pi, pi, 2.5, mean_abs_q=torch.tensor(5.0))
    assert given.item() == pytest.approx(-(2.5 / 5.0) * (-1.0))


def test_behaviour_cloning_loss_by_hand():
    logits = torch.tensor([[0.0, 0.0], [math.log(3.0), 0.0]])
    actions = torch.tensor([0, 0])
    want = (math.log(2.0) + math.log(4.0 / 3.0)) / 2
    assert behaviour_cloning_loss(logits, actions, discrete=True).item() == pytest.approx(want)
    pred = torch.tensor([[0.5, -0.5], [0.0, 1.0]])
    target = torch.tensor([[0.0, 0.0], [0.0, 0.0]])
    assert behaviour_cloning_loss(pred, target, discrete=False).item() == pytest.approx(0.75)
