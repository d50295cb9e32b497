"""Tests for shoal.nn.q_heads: QHead shapes and dueling identity, NoisyLinear noise."""

import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from shoal.nn import NoisyLinear, QHead

IN_DIM, ACTIONS = 8, 3


def _f(x):
    return x.sign() * x.abs().sqrt()


# ----------------------------------------------------------------------------------- QHead


@pytest.mark.parametrize(
    ("dueling", "noisy", "atoms", "hidden"),
    list(itertools.product([False, True], [False, True], [1, 51], [None, 16])),
)
def test_qhead_shapes(dueling, noisy, atoms, hidden):
    torch.manual_seed(0)
    head = QHead(IN_DIM, ACTIONS, atoms=atoms, dueling=dueling, noisy=noisy, hidden=hidden)
    assert head(torch.randn(5, IN_DIM)).shape == (5, ACTIONS, atoms)
    # Any leading axes, e.g. time-major [T, B, ...].
    assert head(torch.randn(2, 4, IN_DIM)).shape == (2, 4, ACTIONS, atoms)
    noisy_layers = [m for m in head.modules() if isinstance(m, NoisyLinear)]
    linear_layers = [m for m in head.modules() if isinstance(m, torch.nn.Linear)]
    per_stream = 1 if hidden is None else 2
    streams = 2 if dueling else 1
    assert len(noisy_layers if noisy else linear_layers) == per_stream * streams
    assert not (noisy_layers if not noisy else linear_layers)


@pytest.mark.parametrize(("noisy", "atoms"), [(False, 1), (False, 51), (True, 1), (True, 51)])
def test_dueling_identity(noisy, atoms):
    torch.manual_seed(1)
    head = QHead(IN_DIM, ACTIONS, atoms=atoms, dueling=True, noisy=noisy, hidden=16)
    features = torch.randn(6, IN_DIM)
    out = head(features)
    # V + A - mean_a A: the mean over actions is the value stream (per atom).
    assert_close(out.mean(dim=-2), head.value(features))


def test_qhead_orthogonal_init():
    torch.manual_seed(2)
    head = QHead(IN_DIM, ACTIONS, atoms=2, hidden=16)
    hidden_layer, _, output = head.q
    assert_close(output.weight @ output.weight.T, torch.eye(ACTIONS * 2))  # gain 1
    assert_close(hidden_layer.weight.T @ hidden_layer.weight, 2.0 * torch.eye(IN_DIM))
    assert (hidden_layer.bias == 0).all() and (output.bias == 0).all()


def test_qhead_reset_noise():
    torch.manual_seed(3)
    head = QHead(IN_DIM, ACTIONS, dueling=True, noisy=True, hidden=16)
    features = torch.randn(4, IN_DIM)
    before = head(features)
    assert_close(head(features), before)  # noise is fixed until reset
    head.reset_noise()
    assert not torch.allclose(head(features), before)
    head.eval()
    assert_close(head(features), head(features))
    QHead(IN_DIM, ACTIONS).reset_noise()  # no noisy layers: a no-op


def test_qhead_bad_arguments():
    with pytest.raises(ValueError, match="atoms must be >= 1"):
        QHead(IN_DIM, ACTIONS, atoms=0)
    with pytest.raises(ValueError, match="hidden"):
        QHead(IN_DIM, ACTIONS, hidden=0)


# ----------------------------------------------------------------------------- NoisyLinear


def test_noisy_linear_init():
    torch.manual_seed(4)
    layer = NoisyLinear(16, 5, sigma0=0.4)
    bound = 1.0 / math.sqrt(16)
    assert layer.weight_mu.abs().max() <= bound and layer.bias_mu.abs().max() <= bound
    assert_close(layer.weight_sigma, torch.full((5, 16), 0.4 / 4))
    assert_close(layer.bias_sigma, torch.full((5,), 0.4 / 4))


def test_noisy_linear_eval_is_deterministic_mean():
    torch.manual_seed(5)
    layer = NoisyLinear(IN_DIM, 4)
    x = torch.randn(3, IN_DIM)
    mean_out = F.linear(x, layer.weight_mu, layer.bias_mu)
    layer.eval()
    first = layer(x)
    layer.reset_noise()
    assert_close(layer(x), first)
    assert_close(first, mean_out)
    layer.train()
    assert not torch.allclose(layer(x), mean_out)
    layer.noise_enabled = False
    assert_close(layer(x), mean_out)


def test_noisy_linear_train_noise_changes_after_reset():
    torch.manual_seed(6)
    layer = NoisyLinear(IN_DIM, 4)
    x = torch.randn(3, IN_DIM)
    first = layer(x)
    assert_close(layer(x), first)
    layer.reset_noise()
    assert not torch.allclose(layer(x), first)


def test_noisy_linear_factorized_noise_from_global_generator():
    layer = NoisyLinear(IN_DIM, 4)
    torch.manual_seed(7)
    layer.reset_noise()
    torch.manual_seed(7)
    eps_in, eps_out = torch.randn(IN_DIM), torch.randn(4)
    assert_close(layer.weight_epsilon, torch.outer(_f(eps_out), _f(eps_in)))
    assert_close(layer.bias_epsilon, _f(eps_out))
    x = torch.randn(2, IN_DIM)
    weight = layer.weight_mu + layer.weight_sigma * torch.outer(_f(eps_out), _f(eps_in))
    bias = layer.bias_mu + layer.bias_sigma * _f(eps_out)
    assert_close(layer(x), F.linear(x, weight, bias))


def test_noisy_linear_gradients_reach_mu_and_sigma():
    torch.manual_seed(8)
    layer = NoisyLinear(IN_DIM, 4)
    layer(torch.randn(5, IN_DIM)).pow(2).sum().backward()
    for name in ("weight_mu", "weight_sigma", "bias_mu", "bias_sigma"):
        grad = getattr(layer, name).grad
        assert grad is not None and grad.abs().sum() > 0, name


def test_noisy_linear_state_dict_carries_noise():
    torch.manual_seed(9)
    layer, copy = NoisyLinear(IN_DIM, 4), NoisyLinear(IN_DIM, 4)
    copy.load_state_dict(layer.state_dict())
    x = torch.randn(2, IN_DIM)
    assert_close(copy(x), layer(x))
