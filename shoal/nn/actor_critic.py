"""Actor-critic model built from an encoder and heads for the env's spaces."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from shoal.config import ModelConfig
from shoal.core.errors import ConfigError, UnsupportedSpaceError
from shoal.core.types import ActOutput
from shoal.envs.agents_as_batch import split_observation
from shoal.envs.composite import PackedActions, PackedObs
from shoal.nn.cnn import ParallelEncoders, build_encoder
from shoal.nn.composite import CompositeEncoder
from shoal.nn.custom import custom_encoder, custom_head, is_custom
from shoal.nn.distributions import Distribution
from shoal.nn.heads import (
    BernoulliHead,
    CategoricalHead,
    GaussianHead,
    MultiCategoricalHead,
    ProductHead,
    ValueHead,
)
from shoal.nn.mlp import MLP, ParallelMLP, width_of


class ObsEncoding(nn.Module):
    """Turns raw observations into flat float features: Box is flattened, Discrete one-hot,
    Dict and Tuple observations (packed, `shoal.envs.composite`) go through one encoder per
    part (`shoal.nn.composite.CompositeEncoder`; ``model`` configures those)."""

    def __init__(self, space: gym.Space, model: ModelConfig | None = None):
        super().__init__()
        self.composite: CompositeEncoder | None = None
        self.num_categories = 0
        if isinstance(space, gym.spaces.Box):
            self.out_dim = int(np.prod(space.shape))
        elif isinstance(space, gym.spaces.Discrete):
            self.num_categories = int(space.n)
            self.out_dim = self.num_categories
        elif isinstance(space, PackedObs):
            self.composite = CompositeEncoder(space, model)
            self.out_dim = self.composite.out_dim
        else:
            raise UnsupportedSpaceError(
                f"observation space {space} is not supported by MLP models; "
                "supported: Box (flattened), Discrete (one-hot), and Dict or Tuple of them "
                "(each part encoded, then joined)"
            )

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if self.composite is not None:
            return self.composite(obs)
        if self.num_categories:
            return nn.functional.one_hot(obs.long(), self.num_categories).float()
        return obs.float().flatten(start_dim=1) if obs.dim() > 2 else obs.float()


def encoder_and_body(
    obs_space: gym.Space, config: ModelConfig, members: int = 1
) -> tuple[nn.Module, nn.Module]:
    """``(encoding, body)``: the observation features are ``body(encoding(obs))``, ``[N, D]``,
    or ``[members, N, D]`` for ``members`` independent bodies (separate actor and critic).

    A user's encoder (``config.encoder`` module:Class, `shoal.nn.custom`) or an image encoder
    (`shoal.nn.cnn`) is the body and the encoding is the identity; otherwise `ObsEncoding`
    (one encoder per part of a Dict/Tuple observation, image parts included) feeds the MLP of
    ``config.hidden``."""
    if is_custom(config.encoder):
        bodies = [custom_encoder(obs_space, config) for _ in range(members)]
        return nn.Identity(), bodies[0] if members == 1 else ParallelEncoders(bodies)
    if config.encoder != "mlp" and not isinstance(obs_space, PackedObs):
        return nn.Identity(), build_encoder(obs_space, config, members)
    encoding = ObsEncoding(obs_space, config)
    if members == 1:
        return encoding, MLP(encoding.out_dim, config.hidden, config.activation)
    return encoding, ParallelMLP(encoding.out_dim, config.hidden, config.activation, members)


def observation_features(obs_space: gym.Space, config: ModelConfig) -> nn.Module:
    """What the off-policy actors and critics read before their own MLPs: a user's encoder
    (``config.encoder`` module:Class) or `ObsEncoding`."""
    if is_custom(config.encoder):
        return custom_encoder(obs_space, config)
    return ObsEncoding(obs_space, config)


def policy_head(action_space: gym.Space, in_dim: int, config: ModelConfig) -> nn.Module:
    """The policy head for ``action_space``: categorical (Discrete), diagonal Gaussian (1-D
    Box), factorized categorical (MultiDiscrete), Bernoulli (MultiBinary), or a product of
    these over the parts of a Tuple/Dict action (packed, `shoal.envs.composite`)."""
    space = action_space
    if config.policy_head is not None:
        return custom_head(in_dim, space, config)
    if isinstance(space, gym.spaces.Discrete):
        return CategoricalHead(in_dim, int(space.n), config.temperature)
    if isinstance(space, gym.spaces.Box) and len(space.shape) == 1:
        return GaussianHead(in_dim, int(space.shape[0]), config.init_log_std)
    if isinstance(space, gym.spaces.MultiDiscrete) and np.asarray(space.nvec).ndim == 1:
        return MultiCategoricalHead(in_dim, np.asarray(space.nvec).tolist(), config.temperature)
    if isinstance(space, gym.spaces.MultiBinary) and np.ndim(space.n) == 0:
        return BernoulliHead(in_dim, int(space.n))  # type: ignore[arg-type]  # ndim 0
    if isinstance(space, PackedActions):
        heads = [policy_head(part.space, in_dim, config) for part in space.parts]
        return ProductHead(heads, [(part.start, part.end) for part in space.parts])
    raise UnsupportedSpaceError(
        f"action space {space} is not supported; supported: Discrete, 1-D Box, 1-D "
        "MultiDiscrete, 1-D MultiBinary, and Tuple or Dict of them"
    )


class ActorCritic(nn.Module):
    """Policy and value function over MLP encoders, shared or separate (or over image
    encoders, `shoal.nn.cnn`, when ``config.encoder`` names one).

    Separate actor and critic encoders are evaluated together as one `ParallelMLP`. An
    observation with a critic-only part (`shoal.envs.agents_as_batch.split_observation`, e.g.
    MAPPO's global state) feeds its actor part to the actor encoder and its critic part to the
    critic encoder; the two are zero-padded to one width so they still run as one batched
    network (the padding meets zero-effect columns, not extra parameters that matter).
    """

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, config: ModelConfig):
        super().__init__()
        self.split = split_observation(obs_space)
        self.shared_trunk = config.shared_trunk
        if self.split is not None:
            if config.encoder != "mlp":
                raise ConfigError(
                    f"model.encoder {config.encoder!r} cannot be combined with a critic-only "
                    "observation part (env.global_state): the actor must not see the global state"
                )
            if config.shared_trunk:
                raise ConfigError(
                    "model.shared_trunk cannot be combined with a critic-only observation "
                    "part (env.global_state): the actor must not see the global state"
                )
            self.encoding: nn.Module | None = None
            self.body: nn.Module = ParallelMLP(
                max(self.split), config.hidden, config.activation, members=2
            )
        else:
            members = 1 if self.shared_trunk else 2
            self.encoding, self.body = encoder_and_body(obs_space, config, members)
        self.policy_head = policy_head(action_space, width_of(self.body), config)
        self.value_head = ValueHead(width_of(self.body))

    def _split_inputs(self, obs: torch.Tensor, split: tuple[int, int]) -> torch.Tensor:
        """``[2, N, width]``: the actor part and the critic part, zero-padded to one width."""
        actor_dim, critic_dim = split
        width = max(actor_dim, critic_dim)
        x = obs.float()
        actor = nn.functional.pad(x[:, :actor_dim], (0, width - actor_dim))
        critic = nn.functional.pad(x[:, actor_dim:], (0, width - critic_dim))
        return torch.stack([actor, critic])

    def features(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Actor and critic features of a batch of observations ``[N, ...]``."""
        if self.split is not None:
            inputs = self._split_inputs(obs, self.split)
            actor_features, critic_features = self.body(inputs).unbind(0)
            return actor_features, critic_features
        assert self.encoding is not None  # built whenever the observation is not split
        features = self.body(self.encoding(obs))
        if self.shared_trunk:
            return features, features
        actor_features, critic_features = features.unbind(0)  # one backward op, not two
        return actor_features, critic_features

    def _policy(self, features: torch.Tensor, action_mask: torch.Tensor | None) -> Distribution:
        if action_mask is None:
            return self.policy_head(features)
        return self.policy_head(features, action_mask)

    def forward(
        self, obs: torch.Tensor, action_mask: torch.Tensor | None = None
    ) -> tuple[Distribution, torch.Tensor]:
        """The policy (restricted to the legal actions of ``action_mask``, when given) and
        the values of a batch of observations."""
        actor_features, critic_features = self.features(obs)
        return self._policy(actor_features, action_mask), self.value_head(critic_features)

    def distribution(
        self, obs: torch.Tensor, action_mask: torch.Tensor | None = None
    ) -> Distribution:
        return self._policy(self.features(obs)[0], action_mask)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.value_head(self.features(obs)[1])

    def act(
        self,
        obs: torch.Tensor,
        deterministic: bool = False,
        action_mask: torch.Tensor | None = None,
    ) -> ActOutput:
        dist, values = self(obs, action_mask)
        actions = dist.mode() if deterministic else dist.sample()
        return ActOutput(actions, dist.log_prob(actions), values)
