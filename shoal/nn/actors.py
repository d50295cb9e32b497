"""Actors of the off-policy actor-critics: deterministic (DDPG, TD3, D4PG, TD3+BC), squashed
Gaussian (SAC, CQL), Gaussian with a tanh mean (IQL) and categorical (discrete SAC).

Every actor works in the unit box ``[-1, 1]^d`` internally and hands the env actions in its own
bounds through `ActionScaler`. Each also carries ``random_actions``, a persistent buffer that
makes it act uniformly at random: the learner sets it until learning starts, and because it is
part of the weights it reaches every sampler (as DQN's epsilon does).

What a sampler and `shoal.nn.policy.ActorPolicy` ask of an actor: ``act(obs)`` (env-unit actions
plus zero log-probs and values, which replay does not use), ``value(obs)`` and
``distribution(obs)`` with ``mode()`` and ``sample()``.
"""

from __future__ import annotations

from collections.abc import Callable

import gymnasium as gym
import torch
from torch import nn
from torch.distributions import Normal
from torch.nn import functional as F

from shoal.config import ModelConfig, NoiseConfig
from shoal.core.errors import UnsupportedSpaceError
from shoal.losses.actor_critic import squashed_gaussian_log_prob
from shoal.nn.action_scaling import ActionScaler, check_bounded_box
from shoal.nn.actor_critic import ActOutput, observation_features
from shoal.nn.distributions import Categorical
from shoal.nn.init import POLICY_GAIN, linear
from shoal.nn.mlp import MLP, width_of

LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0
"""Bounds of SAC's log standard deviation (those of the authors' code), against collapse and
overflow."""


class ActionChoice:
    """A policy's two ways to act on a batch, for `shoal.nn.policy.ActorPolicy`: ``mode()`` is the
    deterministic action, ``sample()`` the exploring one."""

    def __init__(self, mode: Callable[[], torch.Tensor], sample: Callable[[], torch.Tensor]):
        self.mode, self.sample = mode, sample


class GaussianNoise:
    """Independent ``N(0, scale^2)`` noise at every step."""

    def __init__(self, scale: float):
        self.scale = scale

    def __call__(self, like: torch.Tensor) -> torch.Tensor:
        return torch.randn_like(like) * self.scale

    def reset(self) -> None:
        pass

    def state(self) -> torch.Tensor | None:
        return None

    def load_state(self, state: torch.Tensor | None) -> None:
        pass


class OrnsteinUhlenbeckNoise:
    """``scale * x`` with ``x <- x - theta * x + sigma * N(0, 1)``: noise correlated in time,
    one process per env (Lillicrap et al. 2015; RLlib's noise_scale, exploration_theta,
    exploration_sigma). The state belongs to the acting copy of the actor, not to its weights."""

    def __init__(self, scale: float, theta: float, sigma: float):
        self.scale, self.theta, self.sigma = scale, theta, sigma
        self.process: torch.Tensor | None = None

    def __call__(self, like: torch.Tensor) -> torch.Tensor:
        if self.process is None or self.process.shape != like.shape:
            self.process = torch.zeros_like(like)
        self.process += self.sigma * torch.randn_like(like) - self.theta * self.process
        return self.scale * self.process

    def reset(self) -> None:
        self.process = None

    def state(self) -> torch.Tensor | None:
        return None if self.process is None else self.process.clone()

    def load_state(self, state: torch.Tensor | None) -> None:
        self.process = None if state is None else state.clone()


def make_noise(config: NoiseConfig) -> GaussianNoise | OrnsteinUhlenbeckNoise:
    if config.kind == "ou":
        return OrnsteinUhlenbeckNoise(config.scale, config.theta, config.sigma)
    return GaussianNoise(config.scale)


class Actor(nn.Module):
    """What all three actors share: the MLP over encoded observations, the random-action
    switch, and the sampler-facing ``act``/``value``/``distribution``."""

    random_actions: torch.Tensor

    def __init__(self, obs_space: gym.Space, model: ModelConfig):
        super().__init__()
        self.encoding = observation_features(obs_space, model)
        self.body = MLP(width_of(self.encoding), model.hidden, model.activation)
        self.register_buffer("random_actions", torch.tensor(True))

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        return self.body(self.encoding(obs))

    def greedy(self, obs: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def explore(self, obs: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def uniform(self, obs: torch.Tensor) -> torch.Tensor:
        """Uniformly random actions for the batch of ``obs``, on its device."""
        raise NotImplementedError

    def distribution(self, obs: torch.Tensor) -> ActionChoice:
        def sample() -> torch.Tensor:
            return self.uniform(obs) if self.random_actions else self.explore(obs)

        return ActionChoice(lambda: self.greedy(obs), sample)

    def act(self, obs: torch.Tensor, deterministic: bool = False) -> ActOutput:
        dist = self.distribution(obs)
        actions = dist.mode() if deterministic else dist.sample()
        zeros = torch.zeros(obs.shape[0], device=obs.device)
        return ActOutput(actions, zeros, zeros)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """Replay learners bootstrap from replay, not from the sampler: zeros."""
        return torch.zeros(obs.shape[0], device=obs.device)


class DeterministicActor(Actor):
    """``mu(s) = tanh(W h(s) + b)`` in the unit box; explores with additive noise."""

    def __init__(
        self, obs_space: gym.Space, action_space: gym.Space, model: ModelConfig, noise: NoiseConfig
    ):
        super().__init__(obs_space, model)
        space = check_bounded_box(action_space, "a deterministic actor")
        self.action_dim = space.shape[0]
        self.mean = linear(self.body.out_dim, self.action_dim, POLICY_GAIN)
        self.scaler = ActionScaler(space)
        self.noise = make_noise(noise)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """``[N, ...]`` observations -> ``[N, d]`` unit-box actions."""
        return torch.tanh(self.mean(self.features(obs)))

    def greedy(self, obs: torch.Tensor) -> torch.Tensor:
        return self.scaler.to_env(self(obs))

    def explore(self, obs: torch.Tensor) -> torch.Tensor:
        unit = self(obs)
        return self.scaler.to_env((unit + self.noise(unit)).clamp(-1.0, 1.0))

    def uniform(self, obs: torch.Tensor) -> torch.Tensor:
        unit = torch.rand(obs.shape[0], self.action_dim, device=obs.device) * 2 - 1
        return self.scaler.to_env(unit)

    def exploration_state(self) -> torch.Tensor | None:
        """The noise process's state, which the sampler checkpoints (not part of the weights:
        each acting copy has its own)."""
        return self.noise.state()

    def load_exploration_state(self, state: torch.Tensor | None) -> None:
        self.noise.load_state(state)


class SquashedGaussianActor(Actor):
    """``a = tanh(u)``, ``u ~ N(mean(s), std(s)^2)``: SAC's policy (Haarnoja et al. 2018)."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, model: ModelConfig):
        super().__init__(obs_space, model)
        space = check_bounded_box(action_space, "SAC")
        self.action_dim = space.shape[0]
        # One layer for mean and log-std: one matmul instead of two in the hot path.
        self.head = linear(self.body.out_dim, 2 * self.action_dim, POLICY_GAIN)
        self.scaler = ActionScaler(space)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mean, log_std)`` of the pre-squash Gaussian, ``[N, d]`` each."""
        mean, log_std = self.head(self.features(obs)).chunk(2, dim=-1)
        return mean, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)

    def sample(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Reparameterized unit-box actions ``[N, d]`` and their log-probabilities ``[N]``."""
        mean, log_std = self(obs)
        pre_tanh = mean + log_std.exp() * torch.randn_like(mean)
        return torch.tanh(pre_tanh), squashed_gaussian_log_prob(mean, log_std, pre_tanh)

    def sample_many(self, obs: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``k`` actions per observation from one forward pass: ``[N, k, d]`` unit-box
        actions and ``[N, k]`` log-probabilities (CQL's sampled log-sum-exp)."""
        mean, log_std = self(obs)
        mean, log_std = mean.unsqueeze(1), log_std.unsqueeze(1)
        noise = torch.randn(mean.shape[0], k, mean.shape[-1], device=mean.device)
        pre_tanh = mean + log_std.exp() * noise
        return torch.tanh(pre_tanh), squashed_gaussian_log_prob(mean, log_std, pre_tanh)

    def greedy(self, obs: torch.Tensor) -> torch.Tensor:
        return self.scaler.to_env(torch.tanh(self(obs)[0]))

    def explore(self, obs: torch.Tensor) -> torch.Tensor:
        mean, log_std = self(obs)
        return self.scaler.to_env(torch.tanh(mean + log_std.exp() * torch.randn_like(mean)))

    def uniform(self, obs: torch.Tensor) -> torch.Tensor:
        unit = torch.rand(obs.shape[0], self.action_dim, device=obs.device) * 2 - 1
        return self.scaler.to_env(unit)


class GaussianActor(Actor):
    """``a ~ N(tanh(W h(s) + b), diag(std)^2)`` with a state-independent ``std``, clipped to
    the unit box when acting: IQL's policy (Kostrikov et al. 2021), whose log-density of a
    dataset's actions needs no inverse tanh (which diverges at the bounds, where offline
    data often sits)."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, model: ModelConfig):
        super().__init__(obs_space, model)
        space = check_bounded_box(action_space, "a Gaussian actor")
        self.action_dim = space.shape[0]
        self.mean = linear(self.body.out_dim, self.action_dim, POLICY_GAIN)
        self.log_std = nn.Parameter(torch.zeros(self.action_dim))
        self.scaler = ActionScaler(space)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """``[N, ...]`` observations -> ``[N, d]`` mean unit-box actions."""
        return torch.tanh(self.mean(self.features(obs)))

    def std(self) -> torch.Tensor:
        return self.log_std.clamp(LOG_STD_MIN, LOG_STD_MAX).exp()

    def log_prob(self, obs: torch.Tensor, unit_actions: torch.Tensor) -> torch.Tensor:
        """``[N]`` log-densities of ``[N, d]`` unit-box actions."""
        return Normal(self(obs), self.std()).log_prob(unit_actions).sum(dim=-1)

    def greedy(self, obs: torch.Tensor) -> torch.Tensor:
        return self.scaler.to_env(self(obs))

    def explore(self, obs: torch.Tensor) -> torch.Tensor:
        mean = self(obs)
        noisy = mean + self.std() * torch.randn_like(mean)
        return self.scaler.to_env(noisy.clamp(-1.0, 1.0))

    def uniform(self, obs: torch.Tensor) -> torch.Tensor:
        unit = torch.rand(obs.shape[0], self.action_dim, device=obs.device) * 2 - 1
        return self.scaler.to_env(unit)


class CategoricalActor(Actor):
    """A softmax policy over discrete actions (discrete SAC, Christodoulou 2019)."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, model: ModelConfig):
        super().__init__(obs_space, model)
        if not isinstance(action_space, gym.spaces.Discrete):
            raise UnsupportedSpaceError(
                f"a categorical actor needs Discrete actions, got {action_space}"
            )
        self.num_actions = int(action_space.n)
        self.logits = linear(self.body.out_dim, self.num_actions, POLICY_GAIN)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """``[N, A]`` action probabilities."""
        return F.softmax(self.logits(self.features(obs)), dim=-1)

    def greedy(self, obs: torch.Tensor) -> torch.Tensor:
        return self.logits(self.features(obs)).argmax(dim=-1)

    def explore(self, obs: torch.Tensor) -> torch.Tensor:
        return Categorical(self.logits(self.features(obs))).sample()

    def uniform(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.randint(self.num_actions, (obs.shape[0],), device=obs.device)
