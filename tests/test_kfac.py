"""Tests for shoal.optim.kfac: the preconditioned gradient equals the explicit (damped) Fisher
inverse times the gradient where the Kronecker factorization is exact (inputs that do not vary
across samples), the convolution factors by hand, the trust region, the refusal of recurrent
layers and the state round trip."""

import copy

import pytest
import torch
from torch import nn
from torch.testing import assert_close

from shoal.core.errors import ConfigError
from shoal.optim.kfac import KFAC, covered_layers


def _vec(matrix):
    """Column-major vec, the ordering in which vec(G X A^T) = (A kron G) vec(X)."""
    return matrix.T.reshape(-1)


def _unvec(vector, rows):
    return vector.reshape(-1, rows).T


def _augmented_grad(layer):
    grad = layer.weight.grad.reshape(layer.weight.shape[0], -1)
    return torch.cat([grad, layer.bias.grad.unsqueeze(1)], dim=1)


def _explicit_fisher(model, layer, x, samples):
    """``E[vec(dW) vec(dW)^T]`` over outputs sampled from the model: per-sample gradients of
    the log-likelihood of the categorical at the model's output."""
    rows = []
    for y in samples:
        model.zero_grad()
        logits = model(x)
        torch.distributions.Categorical(logits=logits[0]).log_prob(y).backward()
        rows.append(_vec(_augmented_grad(layer)))
    rows = torch.stack(rows)
    return rows.T @ rows / len(rows)


def _pre(optimizer, weight, grad, damping):
    """The K-FAC direction of one (single-member) layer's ``[out, in + 1]`` gradient."""
    (layer,) = [layer for layer in optimizer.layers if layer.weight is weight]
    return optimizer.precondition(layer, grad.unsqueeze(0), damping)[0]


def _fisher_step(model, optimizer, x_batch, y_batch):
    """One recorded forward pass and `accumulate` with the sampled log-likelihood."""
    with optimizer.record():
        logits = model(x_batch)
    log_p = torch.distributions.Categorical(logits=logits).log_prob(y_batch).mean()
    optimizer.accumulate(log_p)


@pytest.mark.parametrize("damping", [1e-3, 1e-1])
def test_linear_matches_explicit_fisher_inverse(damping):
    torch.manual_seed(0)
    torch.set_default_dtype(torch.float64)
    try:
        layer = nn.Linear(3, 4)
        model = nn.Sequential(layer)
        x = torch.randn(1, 3)
        samples = torch.distributions.Categorical(logits=model(x)[0]).sample((64,))
        fisher = _explicit_fisher(model, layer, x, samples)
        optimizer = KFAC(model, damping=damping)
        _fisher_step(model, optimizer, x.expand(64, 3), samples)
        grad = torch.randn(4, 4)  # any [out, in + 1] gradient
        expected = torch.linalg.solve(fisher + damping * torch.eye(16), _vec(grad))
        assert_close(_vec(_pre(optimizer, layer.weight, grad, damping)), expected)
    finally:
        torch.set_default_dtype(torch.float32)


def test_two_layer_blocks_match_explicit_fisher():
    # The same input for every sample: both layers' inputs are constant, so each diagonal
    # block of the exact Fisher is its Kronecker product (K-FAC ignores the off-diagonal ones).
    torch.manual_seed(1)
    torch.set_default_dtype(torch.float64)
    try:
        first, second = nn.Linear(2, 5), nn.Linear(5, 3)
        model = nn.Sequential(first, nn.Tanh(), second)
        x = torch.randn(1, 2)
        samples = torch.distributions.Categorical(logits=model(x)[0]).sample((50,))
        optimizer = KFAC(model, damping=1e-2)
        _fisher_step(model, optimizer, x.expand(50, 2), samples)
        for layer in (first, second):
            fisher = _explicit_fisher(model, layer, x, samples)
            grad = torch.randn(layer.out_features, layer.in_features + 1)
            size = grad.numel()
            expected = torch.linalg.solve(fisher + 1e-2 * torch.eye(size), _vec(grad))
            got = _pre(optimizer, layer.weight, grad, 1e-2)
            assert_close(got, _unvec(expected, layer.out_features))
    finally:
        torch.set_default_dtype(torch.float32)


def test_conv_factors_by_hand():
    torch.manual_seed(2)
    conv = nn.Conv2d(2, 3, kernel_size=2)
    model = nn.Sequential(conv, nn.Flatten(), nn.Linear(3 * 2 * 2, 4))
    optimizer = KFAC(model)
    x = torch.randn(5, 2, 3, 3)
    y = torch.randint(0, 4, (5,))
    with optimizer.record():
        out = conv(x)
        logits = model[2](model[1](out))
    log_p = torch.distributions.Categorical(logits=logits).log_prob(y).mean()
    (out_grad,) = torch.autograd.grad(log_p, out, retain_graph=True)
    optimizer.accumulate(log_p)
    # A: the mean of a a^T over samples and the 4 output locations (patch + bias 1).
    patches = [
        torch.cat([x[b, :, i : i + 2, j : j + 2].reshape(-1), torch.ones(1)])
        for b in range(5)
        for i in range(2)
        for j in range(2)
    ]
    patches = torch.stack(patches)
    assert_close(optimizer.state[conv.weight]["A"][0], patches.T @ patches / 20)
    # G: per-sample gradients at each location (5 x the mean's), summed over locations.
    g = (out_grad * 5).permute(0, 2, 3, 1).reshape(-1, 3)
    assert_close(optimizer.state[conv.weight]["G"][0], g.T @ g / 5)


def test_conv_covering_the_image_matches_explicit_fisher():
    # One output location: the convolution is a linear layer on the flattened image.
    torch.manual_seed(3)
    torch.set_default_dtype(torch.float64)
    try:
        conv = nn.Conv2d(1, 3, kernel_size=2)
        model = nn.Sequential(conv, nn.Flatten())
        x = torch.randn(1, 1, 2, 2)
        samples = torch.distributions.Categorical(logits=model(x)[0]).sample((40,))
        fisher = _explicit_fisher(model, conv, x, samples)
        optimizer = KFAC(model, damping=1e-2)
        _fisher_step(model, optimizer, x.expand(40, 1, 2, 2), samples)
        grad = torch.randn(3, 5)
        expected = torch.linalg.solve(fisher + 1e-2 * torch.eye(15), _vec(grad))
        assert_close(_vec(_pre(optimizer, conv.weight, grad, 1e-2)), expected)
    finally:
        torch.set_default_dtype(torch.float32)


def test_trust_region_bounds_the_predicted_kl():
    torch.manual_seed(4)
    model = nn.Sequential(nn.Linear(3, 4))
    optimizer = KFAC(model, lr=0.5, momentum=0.0, kl_clip=1e-4)
    x, y = torch.randn(32, 3), torch.randint(0, 4, (32,))
    _fisher_step(model, optimizer, x, y)
    before = model[0].weight.detach().clone()
    model.zero_grad()
    (100.0 * nn.functional.cross_entropy(model(x), y)).backward()
    grad = _augmented_grad(model[0]).clone()
    optimizer.step()
    assert optimizer.last_scale < 1.0
    direction = _pre(optimizer, model[0].weight, grad, optimizer.defaults["damping"])
    lr, scale = 0.5, optimizer.last_scale
    step = lr * scale * direction
    # The clipped step's Fisher norm (lr scale)^2 Delta^T F Delta = (lr scale)^2 Delta^T g is
    # exactly kl_clip.
    assert_close(lr * scale * (step * grad).sum(), torch.tensor(1e-4))
    assert_close(model[0].weight.detach(), before - step[:, :3])


def test_recurrent_layers_are_refused():
    model = nn.Sequential(nn.Linear(3, 4), nn.LSTM(4, 4))
    with pytest.raises(ConfigError, match="recurrent layer"):
        KFAC(model)


def test_string_padded_convolutions_are_refused():
    # unfold, which the convolution's factors read patches with, takes padding as numbers.
    model = nn.Sequential(nn.Conv2d(1, 2, 3, padding="same"), nn.Flatten())
    with pytest.raises(ConfigError, match="padding as numbers, not 'same'"):
        covered_layers(model)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="damping"):
        KFAC(nn.Linear(2, 2), damping=0.0)


def test_state_round_trip_continues_identically():
    def make():
        torch.manual_seed(5)
        model = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2))
        return model, KFAC(model, inverse_every=2)

    def train(model, optimizer, steps, seed):
        g = torch.Generator().manual_seed(seed)
        for _ in range(steps):
            x = torch.randn(16, 3, generator=g)
            y = torch.randint(0, 2, (16,), generator=g)
            _fisher_step(model, optimizer, x, y)
            model.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()

    model_a, opt_a = make()
    train(model_a, opt_a, 3, 0)
    saved = copy.deepcopy((model_a.state_dict(), opt_a.state_dict()))
    train(model_a, opt_a, 3, 1)
    model_b, opt_b = make()
    model_b.load_state_dict(saved[0])
    opt_b.load_state_dict(saved[1])
    train(model_b, opt_b, 3, 1)
    for a, b in zip(model_a.parameters(), model_b.parameters(), strict=True):
        assert torch.equal(a, b)


def test_shoal_mlps_are_covered_through_their_taps():
    # shoal's MLP calls F.linear (no module forward) and ParallelMLP one batched matmul per
    # layer: their layers get factors through the taps, one set per ParallelMLP member.
    from shoal.nn.mlp import MLP, ParallelMLP

    torch.manual_seed(6)
    torch.set_default_dtype(torch.float64)
    try:
        mlp, parallel = MLP(3, (4,), "tanh"), ParallelMLP(3, (5,), "tanh", members=2)
        heads = nn.Linear(4 + 2 * 5, 3)

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.mlp, self.parallel, self.head = mlp, parallel, heads

            def forward(self, x):
                members = self.parallel(x)  # [2, N, 5]
                return self.head(torch.cat([self.mlp(x), members[0], members[1]], dim=-1))

        model = Net()
        optimizer = KFAC(model, damping=1e-2)
        assert [layer.name for layer in optimizer.layers] == ["mlp.layers.0", "parallel.0", "head"]
        x = torch.randn(1, 3)
        samples = torch.distributions.Categorical(logits=model(x)[0]).sample((30,))
        _fisher_step(model, optimizer, x.expand(30, 3), samples)
        # The MLP's layer against its explicit Fisher block.
        fisher = _explicit_fisher(model, mlp.layers[0], x, samples)
        grad = torch.randn(4, 4)
        expected = torch.linalg.solve(fisher + 1e-2 * torch.eye(16), _vec(grad))
        assert_close(_vec(_pre(optimizer, mlp.layers[0].weight, grad, 1e-2)), expected)
        # Each ParallelMLP member against the explicit Fisher of its own [out, in + 1] block.
        layer = optimizer.layers[1]
        rows = []
        for y in samples:
            model.zero_grad()
            torch.distributions.Categorical(logits=model(x)[0]).log_prob(y).backward()
            matrix = layer.matrix(parallel.weights[0].grad, parallel.biases[0].grad)
            rows.append(torch.stack([_vec(m) for m in matrix]))
        rows = torch.stack(rows)  # [S, 2, 20]
        grad = torch.randn(2, 5, 4)
        got = optimizer.precondition(layer, grad, 1e-2)
        for member in range(2):
            fisher = rows[:, member].T @ rows[:, member] / len(rows)
            expected = torch.linalg.solve(fisher + 1e-2 * torch.eye(20), _vec(grad[member]))
            assert_close(_vec(got[member]), expected)
    finally:
        torch.set_default_dtype(torch.float32)


def test_a_layer_called_around_its_module_is_an_error():
    class Bypass(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = nn.Linear(3, 2)

        def forward(self, x):
            return nn.functional.linear(x, self.layer.weight, self.layer.bias)

    model = Bypass()
    optimizer = KFAC(model)
    with pytest.raises(RuntimeError, match="saw no activations"):
        _fisher_step(model, optimizer, torch.randn(4, 3), torch.zeros(4, dtype=torch.long))


def test_actor_critic_layers_are_all_covered():
    import gymnasium as gym

    from shoal.config import ModelConfig
    from shoal.nn import build_actor_critic

    model = build_actor_critic(
        gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2), ModelConfig(hidden=(8, 8))
    )
    covered = {id(p) for layer in covered_layers(model) for p in (layer.weight, layer.bias)}
    assert covered == {id(p) for p in model.parameters()}
