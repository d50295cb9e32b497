"""Natural-gradient helpers against explicit matrices: Fisher-vector products, conjugate
gradient, flat parameter views."""

import pytest
import torch
from torch import nn

from shoal.losses import (
    conjugate_gradient,
    fisher_vector_product,
    flat_concat,
    flat_grad,
    set_flat_params,
)
from shoal.nn.distributions import Categorical, DiagGaussian


def tiny_categorical():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 3)).double()
    obs = torch.randn(5, 3, dtype=torch.float64)
    return net, obs


def explicit_categorical_fisher(net, obs):
    """``E_s sum_a pi(a|s) grad log pi(a|s) grad log pi(a|s)^T``, the definition, summed
    exactly over the three actions and averaged over the five states."""
    params = list(net.parameters())
    size = sum(p.numel() for p in params)
    fisher = torch.zeros(size, size, dtype=torch.float64)
    for s in obs:
        log_p = torch.log_softmax(net(s), -1)
        for a in range(log_p.shape[0]):
            g = flat_grad(log_p[a], params, retain_graph=True)
            fisher += log_p[a].exp().detach() * torch.outer(g, g)
    return fisher / obs.shape[0]


@pytest.mark.parametrize("damping", [0.0, 0.1])
def test_fisher_vector_product_matches_the_explicit_fisher_categorical(damping):
    net, obs = tiny_categorical()
    params = list(net.parameters())
    dist = Categorical(net(obs))
    old = Categorical(net(obs).detach())
    fvp = fisher_vector_product(old.kl(dist).mean(), params, damping)
    fisher = explicit_categorical_fisher(net, obs) + damping * torch.eye(
        sum(p.numel() for p in params), dtype=torch.float64
    )
    for seed in range(3):
        v = torch.randn(fisher.shape[0], generator=torch.Generator().manual_seed(seed)).double()
        torch.testing.assert_close(fvp(v), fisher @ v)  # the graph is reused across products


def test_fisher_vector_product_matches_the_explicit_fisher_gaussian():
    """Diagonal Gaussian with a learned log-std: the Fisher of (mean, log_std) per state is
    diag(1/sigma^2, 2), pulled back through the mean network's Jacobian."""
    torch.manual_seed(1)
    net = nn.Linear(2, 2).double()
    log_std = nn.Parameter(torch.tensor([0.3, -0.2], dtype=torch.float64))
    obs = torch.randn(4, 2, dtype=torch.float64)
    params = [*net.parameters(), log_std]
    dist = DiagGaussian(net(obs), log_std)
    old = DiagGaussian(net(obs).detach(), log_std.detach())
    fvp = fisher_vector_product(old.kl(dist).mean(), params, damping=0.0)

    size = sum(p.numel() for p in params)
    fisher = torch.zeros(size, size, dtype=torch.float64)
    inv_var = torch.exp(-2 * log_std.detach())
    for s in obs:
        mean = net(s)
        # Rows: d mean_i / d theta and d log_std_i / d theta.
        jac = torch.stack([flat_grad(mean[i], params, retain_graph=True) for i in range(2)])
        jac_std = torch.zeros(2, size, dtype=torch.float64)
        jac_std[0, -2], jac_std[1, -1] = 1.0, 1.0
        fisher += (
            jac.T @ torch.diag(inv_var) @ jac + jac_std.T @ (2 * torch.eye(2).double()) @ jac_std
        )
    fisher /= obs.shape[0]
    v = torch.randn(size, dtype=torch.float64)
    torch.testing.assert_close(fvp(v), fisher @ v)


def random_spd(n, seed):
    g = torch.Generator().manual_seed(seed)
    m = torch.randn(n, n, generator=g, dtype=torch.float64)
    return m @ m.T + 0.5 * torch.eye(n, dtype=torch.float64), torch.randn(
        n, generator=g, dtype=torch.float64
    )


def test_conjugate_gradient_matches_a_direct_solve():
    a, b = random_spd(6, seed=0)
    calls = []
    x = conjugate_gradient(lambda v: calls.append(1) or a @ v, b, iters=20, residual_tol=1e-20)
    torch.testing.assert_close(x, torch.linalg.solve(a, b))
    assert len(calls) <= 20


def test_conjugate_gradient_one_iteration_is_the_exact_line_minimum_along_b():
    a, b = random_spd(5, seed=1)
    x = conjugate_gradient(lambda v: a @ v, b, iters=1)
    torch.testing.assert_close(x, (b @ b) / (b @ a @ b) * b)


def test_conjugate_gradient_stops_at_the_residual_tolerance():
    a = torch.diag(torch.tensor([2.0, 4.0], dtype=torch.float64))
    b = torch.tensor([2.0, 0.0], dtype=torch.float64)
    calls = []
    x = conjugate_gradient(lambda v: calls.append(1) or a @ v, b, iters=10, residual_tol=1e-12)
    assert len(calls) == 1  # b is an eigenvector: solved exactly in one step
    torch.testing.assert_close(x, torch.tensor([1.0, 0.0], dtype=torch.float64))
    assert torch.equal(conjugate_gradient(lambda v: a @ v, torch.zeros(2), iters=5), torch.zeros(2))


def test_flat_helpers_round_trip_and_check_sizes():
    params = [torch.zeros(2, 3), torch.zeros(4)]
    flat = torch.arange(10.0)
    set_flat_params(params, flat)
    assert params[0].tolist() == [[0, 1, 2], [3, 4, 5]] and params[1].tolist() == [6, 7, 8, 9]
    assert torch.equal(flat_concat(params), flat)
    with pytest.raises(ValueError, match="11 entries"):
        set_flat_params(params, torch.zeros(11))


def test_flat_grad_gives_zeros_for_unused_parameters():
    used, unused = torch.ones(2, requires_grad=True), torch.ones(3, requires_grad=True)
    grad = flat_grad((3 * used).sum(), [used, unused])
    assert grad.tolist() == [3.0, 3.0, 0.0, 0.0, 0.0]
