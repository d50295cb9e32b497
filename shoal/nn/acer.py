"""ACER's networks (Wang et al. 2017, "Sample efficient actor-critic with experience replay",
arXiv:1611.01224): one trunk with a policy head and a critic.

* Discrete actions: the critic is ``Q(x, .)``, one output per action, and ``V(x)`` is its
  expectation under the policy, ``sum_a pi(a|x) Q(x, a)``.
* Continuous actions (1-D Box): the stochastic dueling network (section 4): ``V(x)`` and an
  advantage ``A(x, a)`` on the features and the action give
  ``Q~(x, a) = V(x) + A(x, a) - 1/n sum_i A(x, u_i)``, ``u_i ~ pi(.|x)``, an estimate of Q that
  is consistent with V in expectation. The policy is a diagonal Gaussian with a learned,
  state-independent log-std.

The policy's statistics ``phi`` (the logits, or the mean and log-std) are one tensor
(`ACERNetwork.policy_params`), so that ACER's trust region can act on them; `forward` gives
``(distribution, V)`` like every actor-critic, for samplers and deployed policies.
"""

from __future__ import annotations

import gymnasium as gym
import torch
from torch import nn

from shoal.config import ModelConfig
from shoal.core.errors import UnsupportedSpaceError
from shoal.core.types import ActOutput
from shoal.nn.actor_critic import encoder_and_body
from shoal.nn.distributions import Categorical, DiagGaussian
from shoal.nn.heads import CategoricalHead, GaussianHead, ValueHead
from shoal.nn.init import linear
from shoal.nn.mlp import MLP, width_of

Distribution = Categorical | DiagGaussian


class ACERNetwork(nn.Module):
    """See the module docstring."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, config: ModelConfig):
        super().__init__()
        self.encoding, self.body = encoder_and_body(obs_space, config)
        width = width_of(self.body)
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        if isinstance(action_space, gym.spaces.Discrete):
            self.num_actions = int(action_space.n)
            self.policy_head: nn.Module = CategoricalHead(width, self.num_actions)
            self.q_head = linear(width, self.num_actions, 1.0)
        elif isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1:
            self.action_dim = int(action_space.shape[0])
            self.policy_head = GaussianHead(width, self.action_dim, config.init_log_std)
            self.value_head = ValueHead(width)
            self.advantage_body = MLP(width + self.action_dim, config.hidden, config.activation)
            self.advantage_head = linear(self.advantage_body.out_dim, 1, 1.0)
        else:
            raise UnsupportedSpaceError(
                f"ACER supports Discrete and 1-D Box action spaces, not {action_space}"
            )

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        return self.body(self.encoding(obs))

    def policy_params(self, features: torch.Tensor) -> torch.Tensor:
        """``phi``, ``[N, P]``: the logits (``P = A``) or the mean and log-std (``P = 2A``)."""
        head = self.policy_head
        if isinstance(head, CategoricalHead):
            return head.logits(features) / head.temperature
        assert isinstance(head, GaussianHead)
        mean = head.mean(features)
        return torch.cat([mean, head.log_std.expand_as(mean)], dim=-1)

    def distribution_of(self, params: torch.Tensor) -> Distribution:
        """The policy with statistics ``params`` (from `policy_params`)."""
        if self.discrete:
            return Categorical(params)
        mean, log_std = params.chunk(2, dim=-1)
        return DiagGaussian(mean, log_std)

    def advantage(self, features: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """``A(x, a)``, ``[N]`` (continuous actions)."""
        x = torch.cat([features, actions.to(features.dtype)], dim=-1)
        return self.advantage_head(self.advantage_body(x)).squeeze(-1)

    def critic(
        self, features: torch.Tensor, dist: Distribution
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(V(x), Q(x, .))``: the policy's expectation of the Q head's ``[N, A]`` values
        (discrete actions), or the value head and None (continuous)."""
        if isinstance(dist, Categorical):
            q = self.q_head(features)
            return (dist.logits.exp() * q).sum(-1), q
        return self.value_head(features), None

    def forward(self, obs: torch.Tensor) -> tuple[Distribution, torch.Tensor]:
        features = self.features(obs)
        dist = self.distribution_of(self.policy_params(features))
        return dist, self.critic(features, dist)[0]

    def distribution(self, obs: torch.Tensor) -> Distribution:
        return self.distribution_of(self.policy_params(self.features(obs)))

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self(obs)[1]

    def act(self, obs: torch.Tensor, deterministic: bool = False) -> ActOutput:
        dist, values = self(obs)
        actions = dist.mode() if deterministic else dist.sample()
        return ActOutput(actions, dist.log_prob(actions), values)
