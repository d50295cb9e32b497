"""Tests for the off-policy actor-critic networks: shoal.nn.action_scaling, shoal.nn.target,
shoal.nn.actors and shoal.nn.critics."""

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn
from torch.testing import assert_close

from shoal.config import ModelConfig, NoiseConfig
from shoal.core.errors import UnsupportedSpaceError
from shoal.losses.actor_critic import squashed_gaussian_log_prob
from shoal.nn.action_scaling import ActionScaler, check_bounded_box
from shoal.nn.actors import (
    LOG_STD_MAX,
    CategoricalActor,
    DeterministicActor,
    GaussianNoise,
    OrnsteinUhlenbeckNoise,
    SquashedGaussianActor,
)
from shoal.nn.critics import CriticEnsemble
from shoal.nn.target import frozen_copy, soft_update

OBS = gym.spaces.Box(-1.0, 1.0, (3,))
BOX = gym.spaces.Box(low=np.array([-2.0, 0.0]), high=np.array([2.0, 10.0]))
LOW = torch.tensor([-2.0, 0.0])
HIGH = torch.tensor([2.0, 10.0])
DISCRETE = gym.spaces.Discrete(4)
MODEL = ModelConfig(hidden=(16,), activation="relu")


def _obs(n, seed=0):
    return torch.rand(n, 3, generator=torch.Generator().manual_seed(seed)) * 2 - 1


# ----------------------------------------------------------------------------- ActionScaler


def test_action_scaler_endpoints_and_center():
    scaler = ActionScaler(BOX)
    # center = (high + low) / 2 = [0, 5]; half range = (high - low) / 2 = [2, 5].
    unit = torch.tensor([[-1.0, -1.0], [1.0, 1.0], [0.0, 0.0], [0.5, -0.5]])
    want = torch.tensor([[-2.0, 0.0], [2.0, 10.0], [0.0, 5.0], [1.0, 2.5]])
    assert_close(scaler.to_env(unit), want)
    assert_close(scaler.to_unit(want), unit)


def test_action_scaler_round_trip_and_clipping():
    scaler = ActionScaler(BOX)
    unit = torch.rand(100, 2, generator=torch.Generator().manual_seed(0)) * 2 - 1
    assert_close(scaler.to_unit(scaler.to_env(unit)), unit)
    # Env actions outside the bounds: (-3 - 0) / 2 = -1.5 -> -1; (12 - 5) / 5 = 1.4 -> 1;
    # (2.5 - 0) / 2 = 1.25 -> 1; (-1 - 5) / 5 = -1.2 -> -1.
    out = scaler.to_unit(torch.tensor([[-3.0, 12.0], [2.5, -1.0]]))
    assert_close(out, torch.tensor([[-1.0, 1.0], [1.0, -1.0]]))


def test_action_scaler_bounds_are_buffers():
    state = ActionScaler(BOX).state_dict()
    assert_close(state["center"], torch.tensor([0.0, 5.0]))
    assert_close(state["half_range"], torch.tensor([2.0, 5.0]))


def test_check_bounded_box_accepts_bounded_1d_box():
    assert check_bounded_box(BOX, "TD3") is BOX


@pytest.mark.parametrize(
    "space",
    [
        gym.spaces.Box(low=np.array([-np.inf, 0.0]), high=np.array([1.0, 1.0])),
        gym.spaces.Box(low=np.array([-1.0, 0.0]), high=np.array([1.0, np.inf])),
        gym.spaces.Box(-np.inf, np.inf, (2,)),
    ],
)
def test_check_bounded_box_rejects_unbounded(space):
    with pytest.raises(UnsupportedSpaceError, match="unbounded"):
        check_bounded_box(space, "TD3")


@pytest.mark.parametrize("space", [gym.spaces.Box(-1.0, 1.0, (2, 2)), DISCRETE])
def test_check_bounded_box_rejects_non_1d_box(space):
    with pytest.raises(UnsupportedSpaceError, match="TD3"):
        check_bounded_box(space, "TD3")


def test_continuous_actors_reject_unsupported_spaces():
    with pytest.raises(UnsupportedSpaceError, match="unbounded"):
        DeterministicActor(OBS, gym.spaces.Box(-np.inf, np.inf, (2,)), MODEL, NoiseConfig())
    with pytest.raises(UnsupportedSpaceError):
        SquashedGaussianActor(OBS, DISCRETE, MODEL)
    with pytest.raises(UnsupportedSpaceError):
        CategoricalActor(OBS, BOX, MODEL)


# --------------------------------------------------------------------------- target networks


def test_soft_update_hand_computed():
    target = [torch.tensor([1.0, 2.0]), torch.tensor([[0.0]])]
    online = [torch.tensor([3.0, -2.0]), torch.tensor([[10.0]])]
    soft_update(target, online, 0.1)
    # 1 + 0.1 (3 - 1) = 1.2; 2 + 0.1 (-2 - 2) = 1.6; 0 + 0.1 * 10 = 1.
    assert_close(target[0], torch.tensor([1.2, 1.6]))
    assert_close(target[1], torch.tensor([[1.0]]))
    assert_close(online[0], torch.tensor([3.0, -2.0]))  # online untouched
    soft_update(target, online, 1.0)
    assert torch.equal(target[0], online[0]) and torch.equal(target[1], online[1])
    assert target[0].data_ptr() != online[0].data_ptr()  # a copy, not an alias


def test_frozen_copy_and_soft_update_on_parameters():
    torch.manual_seed(0)
    net = nn.Linear(3, 2)
    target = frozen_copy(net)
    assert all(not p.requires_grad for p in target.parameters())
    assert all(p.requires_grad for p in net.parameters())
    for p, q in zip(target.parameters(), net.parameters(), strict=True):
        assert torch.equal(p, q) and p.data_ptr() != q.data_ptr()
    before = [p.clone() for p in target.parameters()]
    with torch.no_grad():
        for p in net.parameters():
            p.add_(1.0)
    # The copy is independent of later changes to the online network...
    for p, b in zip(target.parameters(), before, strict=True):
        assert torch.equal(p, b)
    # ... until a soft update moves it a quarter of the way: b + 0.25 ((b + 1) - b).
    soft_update(list(target.parameters()), list(net.parameters()), 0.25)
    for p, b in zip(target.parameters(), before, strict=True):
        assert_close(p, b + 0.25)
    assert all(not p.requires_grad for p in target.parameters())


# ----------------------------------------------------------------------------------- actors


def _actors(noise=None):
    torch.manual_seed(0)
    return [
        DeterministicActor(OBS, BOX, MODEL, noise or NoiseConfig()),
        SquashedGaussianActor(OBS, BOX, MODEL),
    ]


def _greedy_unit(actor, obs):
    """The greedy unit-box action computed from the layers (hidden=(16,), relu)."""
    h = torch.relu(actor.body.layers[0](obs))
    if isinstance(actor, DeterministicActor):
        return torch.tanh(actor.mean(h))
    return torch.tanh(actor.head(h)[:, : actor.action_dim])


def _hand_to_env(unit):
    # center [0, 5] + unit * half range [2, 5].
    return torch.tensor([0.0, 5.0]) + unit * torch.tensor([2.0, 5.0])


@pytest.mark.parametrize("index", [0, 1])
def test_continuous_act_random_by_default_and_uniform(index):
    actor = _actors()[index]
    assert bool(actor.random_actions)
    torch.manual_seed(1)
    with torch.no_grad():
        out = actor.act(_obs(2000))
    actions = out.actions
    assert actions.shape == (2000, 2)
    assert out.log_probs.shape == (2000,) and out.values.shape == (2000,)
    assert (actions >= LOW).all() and (actions <= HIGH).all()
    # Uniform over [low, high] (the tiny-gain actor alone would sit near the center [0, 5]).
    # In [0, 1] coordinates v = (a - low) / (high - low): min ~0, max ~1 (P(min > 0.01) =
    # 0.99^2000 ~ 2e-9), mean 1/2 (standard error 0.0065), std 1/sqrt(12) = 0.288675
    # (s.e. 0.003), quartiles 1/4 and 3/4 (s.e. 0.0097).
    v = (actions - LOW) / (HIGH - LOW)
    for d in range(2):
        col = v[:, d]
        assert col.min() < 0.01 and col.max() > 0.99
        assert col.mean().item() == pytest.approx(0.5, abs=0.025)
        assert col.std().item() == pytest.approx(0.288675, abs=0.015)
        q = torch.quantile(col, torch.tensor([0.25, 0.75]))
        assert_close(q, torch.tensor([0.25, 0.75]), atol=0.04, rtol=0)


@pytest.mark.parametrize("index", [0, 1])
def test_continuous_deterministic_act_is_greedy(index):
    actor = _actors()[index]
    actor.random_actions.fill_(False)
    obs = _obs(32)
    with torch.no_grad():
        first = actor.act(obs, deterministic=True).actions
        second = actor.act(obs, deterministic=True).actions
        want = _hand_to_env(_greedy_unit(actor, obs))
        mode = actor.distribution(obs).mode()
    assert first.shape == (32, 2)
    assert_close(first, want)
    assert torch.equal(first, second)
    assert_close(mode, want)
    assert (first >= LOW).all() and (first <= HIGH).all()


@pytest.mark.parametrize("index", [0, 1])
def test_deterministic_act_ignores_random_actions_switch(index):
    # mode() is the greedy action whether or not random_actions is set (evaluation).
    actor = _actors()[index]
    obs = _obs(8)
    with torch.no_grad():
        assert_close(
            actor.act(obs, deterministic=True).actions, _hand_to_env(_greedy_unit(actor, obs))
        )


@pytest.mark.parametrize("index", [0, 1])
def test_exploring_act_in_bounds_and_varies(index):
    actor = _actors(NoiseConfig(scale=0.5))[index]
    actor.random_actions.fill_(False)
    obs = _obs(500)
    with torch.no_grad():
        a = actor.act(obs).actions
        b = actor.act(obs).actions
        greedy = actor.act(obs, deterministic=True).actions
    assert a.shape == (500, 2)
    assert (a >= LOW).all() and (a <= HIGH).all()
    assert not torch.equal(a, b)
    assert not torch.equal(a, greedy)


def test_gaussian_noise_scale_zero_explores_greedily():
    actor = _actors(NoiseConfig(kind="gaussian", scale=0.0))[0]
    assert isinstance(actor.noise, GaussianNoise)
    assert actor.exploration_state() is None  # independent noise has no state to carry
    actor.random_actions.fill_(False)
    obs = _obs(16)
    with torch.no_grad():
        assert torch.equal(actor.act(obs).actions, actor.act(obs, deterministic=True).actions)


def test_gaussian_noise_is_scaled_and_independent():
    noise = GaussianNoise(0.3)
    torch.manual_seed(0)
    like = torch.zeros(20000, 1)
    x, y = noise(like), noise(like)
    assert x.std().item() == pytest.approx(0.3, abs=0.01)
    corr = torch.corrcoef(torch.stack([x.flatten(), y.flatten()]))[0, 1]
    assert abs(corr.item()) < 0.03


def test_ou_noise_lag_one_autocorrelation_is_one_minus_theta():
    # x_{t+1} = (1 - theta) x_t + sigma eps: an AR(1) with lag-1 autocorrelation 1 - theta
    # = 0.85 and stationary std sigma / sqrt(1 - 0.85^2) = 0.2 / 0.52678 = 0.37966, times
    # scale 0.5 = 0.18983.
    noise = OrnsteinUhlenbeckNoise(scale=0.5, theta=0.15, sigma=0.2)
    torch.manual_seed(0)
    like = torch.zeros(64, 1)  # 64 independent processes
    samples = torch.stack([noise(like).clone() for _ in range(400)])[100:]  # past burn-in
    x, y = samples[:-1].flatten(), samples[1:].flatten()
    corr = torch.corrcoef(torch.stack([x, y]))[0, 1].item()
    assert corr == pytest.approx(0.85, abs=0.03)
    assert samples.std().item() == pytest.approx(0.18983, rel=0.1)


def test_ou_noise_reset_and_first_step():
    noise = OrnsteinUhlenbeckNoise(scale=0.5, theta=0.15, sigma=0.2)
    like = torch.zeros(3, 2)
    torch.manual_seed(0)
    eps1, eps2 = torch.randn(3, 2), torch.randn(3, 2)
    torch.manual_seed(0)
    first, second = noise(like).clone(), noise(like).clone()
    # From state 0: x1 = 0.2 eps1, x2 = 0.85 x1 + 0.2 eps2; output 0.5 x.
    assert_close(first, 0.5 * 0.2 * eps1)
    assert_close(second, 0.5 * (0.85 * 0.2 * eps1 + 0.2 * eps2))
    noise.reset()
    assert noise.state() is None
    torch.manual_seed(0)
    assert_close(noise(like), 0.5 * 0.2 * eps1)  # starts again from 0
    # A new batch shape restarts the process too.
    assert noise(torch.zeros(5, 2)).shape == (5, 2)


def test_deterministic_actor_ou_exploration_is_correlated_and_resets():
    # sigma 0.1: stationary std 0.19, so clipping at the box edge (~5 std) is rare and the
    # noise can be read back as to_unit(action) - greedy unit action.
    actor = _actors(NoiseConfig(kind="ou", scale=1.0, theta=0.15, sigma=0.1))[0]
    assert isinstance(actor.noise, OrnsteinUhlenbeckNoise)
    actor.random_actions.fill_(False)
    obs = _obs(64)
    torch.manual_seed(0)
    with torch.no_grad():
        greedy = _greedy_unit(actor, obs)
        noise = torch.stack(
            [actor.scaler.to_unit(actor.act(obs).actions) - greedy for _ in range(150)]
        )[40:]
    x, y = noise[:-1].flatten(), noise[1:].flatten()
    corr = torch.corrcoef(torch.stack([x, y]))[0, 1].item()
    assert corr == pytest.approx(0.85, abs=0.04)
    assert actor.exploration_state() is not None
    actor.noise.reset()
    assert actor.exploration_state() is None


def test_ou_exploration_state_round_trip():
    actor = _actors(NoiseConfig(kind="ou", scale=1.0, theta=0.15, sigma=0.1))[0]
    actor.random_actions.fill_(False)
    obs = _obs(4)
    torch.manual_seed(0)
    with torch.no_grad():
        for _ in range(5):
            actor.act(obs)
        saved = actor.exploration_state()
        torch.manual_seed(1)
        want = actor.act(obs).actions
        actor.load_exploration_state(saved)
        torch.manual_seed(1)
        assert torch.equal(actor.act(obs).actions, want)
    assert saved.shape == (4, 2)
    # The saved state is a copy: later steps do not change it.
    assert not torch.equal(saved, actor.exploration_state())


def test_squashed_gaussian_sample_log_prob_and_range():
    actor = _actors()[1]
    obs = _obs(256)
    torch.manual_seed(3)
    actions, log_prob = actor.sample(obs)
    assert actions.shape == (256, 2) and log_prob.shape == (256,)
    assert (actions > -1).all() and (actions < 1).all()
    # Recompute from the same noise.
    mean, log_std = actor(obs)
    torch.manual_seed(3)
    pre_tanh = mean + log_std.exp() * torch.randn(256, 2)
    assert_close(actions, torch.tanh(pre_tanh))
    assert_close(log_prob, squashed_gaussian_log_prob(mean, log_std, pre_tanh))


def test_squashed_gaussian_sample_is_reparameterized():
    actor = _actors()[1]
    torch.manual_seed(0)
    actions, log_prob = actor.sample(_obs(64))
    (actions.sum() + log_prob.sum()).backward()
    for name, p in actor.named_parameters():
        assert p.grad is not None, name
        assert p.grad.abs().sum() > 0, name


def test_squashed_gaussian_log_std_is_clamped():
    actor = _actors()[1]
    with torch.no_grad():
        actor.head.bias[actor.action_dim :] = 50.0
    _, log_std = actor(_obs(4))
    assert_close(log_std, torch.full((4, 2), LOG_STD_MAX))


def test_categorical_actor():
    torch.manual_seed(0)
    actor = CategoricalActor(OBS, DISCRETE, MODEL)
    obs = _obs(400)
    with torch.no_grad():
        random = actor.act(obs).actions
        assert random.dtype == torch.int64 and random.shape == (400,)
        assert set(random.tolist()) == {0, 1, 2, 3}  # uniform: each ~100 times
        actor.random_actions.fill_(False)
        greedy = actor.act(obs, deterministic=True).actions
        assert torch.equal(greedy, actor(obs).argmax(dim=-1))
        assert torch.equal(greedy, actor.distribution(obs).mode())
        assert torch.equal(greedy, actor.act(obs, deterministic=True).actions)
        probs = actor(obs)
        explored = actor.act(obs).actions
    assert_close(probs.sum(-1), torch.ones(400))
    assert explored.dtype == torch.int64
    assert ((explored >= 0) & (explored < 4)).all()
    # The tiny-gain policy is near uniform, so sampling differs from the argmax often.
    assert (explored != greedy).float().mean() > 0.5


@pytest.mark.parametrize("kind", ["deterministic", "gaussian", "categorical"])
def test_random_actions_travels_in_state_dict(kind):
    def make():
        if kind == "deterministic":
            return DeterministicActor(OBS, BOX, MODEL, NoiseConfig())
        if kind == "gaussian":
            return SquashedGaussianActor(OBS, BOX, MODEL)
        return CategoricalActor(OBS, DISCRETE, MODEL)

    learner, sampler = make(), make()
    assert "random_actions" in learner.state_dict()
    learner.random_actions.fill_(False)
    assert bool(sampler.random_actions)
    sampler.load_state_dict(learner.state_dict())
    assert not bool(sampler.random_actions)
    obs = _obs(8)
    with torch.no_grad():
        # Same weights, greedy exploration off: identical deterministic actions.
        assert torch.equal(
            sampler.act(obs, deterministic=True).actions,
            learner.act(obs, deterministic=True).actions,
        )


# ---------------------------------------------------------------------------------- critics


def _critic_by_hand(critic, x, member):
    h = torch.relu(x @ critic.body.weights[0][member] + critic.body.biases[0][member])
    return h @ critic.out_weight[member] + critic.out_bias[member]


def test_critic_ensemble_continuous_shape_and_members():
    torch.manual_seed(0)
    critic = CriticEnsemble(OBS, 2, 1, MODEL, members=2)
    obs, actions = _obs(5), torch.rand(5, 2) * 2 - 1
    q = critic(obs, actions)
    assert q.shape == (2, 5, 1)
    x = torch.cat([obs, actions], dim=-1)
    for m in range(2):
        assert_close(q[m], _critic_by_hand(critic, x, m))
    assert not torch.allclose(q[0], q[1])  # independent initializations


@pytest.mark.parametrize(("out_dim", "members"), [(4, 2), (51, 3)])
def test_critic_ensemble_discrete_shape(out_dim, members):
    torch.manual_seed(0)
    critic = CriticEnsemble(OBS, 0, out_dim, MODEL, members=members)
    obs = _obs(6)
    q = critic(obs)
    assert q.shape == (members, 6, out_dim)
    for m in range(members):
        assert_close(q[m], _critic_by_hand(critic, obs, m))
    assert not torch.allclose(q[0], q[1])


def test_critic_ensemble_discrete_observations():
    torch.manual_seed(0)
    critic = CriticEnsemble(gym.spaces.Discrete(5), 0, 3, MODEL)
    obs = torch.tensor([0, 4, 2])
    q = critic(obs)
    assert q.shape == (2, 3, 3)
    assert_close(q[1], _critic_by_hand(critic, torch.eye(5)[obs], 1))


def test_critic_detach_weights_same_values_grads_to_inputs_only():
    torch.manual_seed(0)
    critic = CriticEnsemble(OBS, 2, 1, MODEL)
    obs = _obs(7)
    actions = (torch.rand(7, 2) * 2 - 1).requires_grad_(True)
    q_detached = critic(obs, actions, detach_weights=True)
    assert_close(q_detached, critic(obs, actions))
    q_detached.sum().backward()
    for name, p in critic.named_parameters():
        assert p.grad is None, name
    assert actions.grad is not None and actions.grad.abs().sum() > 0
    # Without detaching, the same backward reaches every weight.
    critic(obs, actions).sum().backward()
    for name, p in critic.named_parameters():
        assert p.grad is not None, name
