"""Q-function ensembles for the off-policy actor-critics, evaluated as one batched network,
and the inputs of a team's centralized critics (MADDPG's, CTEDD's).

TD3 and SAC train two critics of the same shape on the same batch. Stacking their weights on a
member axis (`ParallelMLP`) evaluates both with one batched matmul per layer, forward and
backward, instead of two networks' worth of small operations: on the small networks of control
tasks, per-operation overhead is a large part of an update.
"""

from __future__ import annotations

import gymnasium as gym
import torch
from torch import nn

from shoal.config import ModelConfig
from shoal.envs.shapes import shape_of
from shoal.nn.actor_critic import observation_features
from shoal.nn.init import VALUE_GAIN, linear
from shoal.nn.mlp import ParallelMLP, width_of


class CriticEnsemble(nn.Module):
    """``members`` critics: ``Q_m(s, a)`` for continuous actions (the input is the encoded
    observation joined with the unit-box action) or ``Q_m(s, .)`` over discrete actions (the
    input is the observation alone, one output per action).

    Args:
        obs_space: the observation space.
        action_dim: size of continuous actions fed as input, or 0 for discrete actions.
        out_dim: outputs per member: 1 (a Q-value), the number of discrete actions, or the
            atoms of a distributional critic (D4PG).
        model: hidden sizes and activation.
        members: number of critics (2 for TD3 and SAC's clipped double-Q).
    """

    def __init__(
        self,
        obs_space: gym.Space,
        action_dim: int,
        out_dim: int,
        model: ModelConfig,
        members: int = 2,
    ):
        super().__init__()
        self.encoding = observation_features(obs_space, model)
        self.members = members
        self.body = ParallelMLP(
            width_of(self.encoding) + action_dim, model.hidden, model.activation, members
        )
        weight = torch.stack(
            [
                linear(self.body.out_dim, out_dim, VALUE_GAIN).weight.detach().T
                for _ in range(members)
            ]
        )
        self.out_weight = nn.Parameter(weight.contiguous())
        self.out_bias = nn.Parameter(torch.zeros(members, 1, out_dim))

    def forward(
        self,
        obs: torch.Tensor,
        actions: torch.Tensor | None = None,
        detach_weights: bool = False,
    ) -> torch.Tensor:
        """``[N, ...]`` observations (and ``[N, d]`` unit-box actions) -> ``[members, N,
        out_dim]``. ``detach_weights``: gradients reach the inputs but not the weights (an
        actor's loss through the critic)."""
        x = self.encoding(obs)
        if actions is not None:
            x = torch.cat([x, actions], dim=-1)
        return self.evaluate(x, detach_weights)

    def evaluate(self, inputs: torch.Tensor, detach_weights: bool = False) -> torch.Tensor:
        """The critics on already assembled inputs: ``[N, in]`` shared by all members, or
        ``[members, N, in]``, one input per member (MADDPG's critic ``i`` sees agent ``i``'s
        own policy action among the others' replayed ones) -> ``[members, N, out_dim]``."""
        h = self.body(inputs, detach_weights)
        weight: torch.Tensor = self.out_weight
        bias: torch.Tensor = self.out_bias
        if detach_weights:
            weight, bias = weight.detach(), bias.detach()
        return torch.baddbmm(bias, h, weight)


def q_ensemble(
    obs_space: gym.Space, action_space: gym.Space, model: ModelConfig, members: int = 2
) -> CriticEnsemble:
    """``members`` Q critics: ``Q(s, .)`` over a Discrete space's actions (one output each),
    else ``Q(s, a)`` on unit-box actions (SAC's, CQL's and IQL's twin critics)."""
    if isinstance(action_space, gym.spaces.Discrete):
        return CriticEnsemble(obs_space, 0, int(action_space.n), model, members=members)
    return CriticEnsemble(obs_space, shape_of(action_space)[0], 1, model, members=members)


def taken_q(q_all: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """``[M, N]`` values of the ``[N]`` discrete ``actions`` among ``[M, N, A]``."""
    index = actions.long().view(1, -1, 1).expand(q_all.shape[0], -1, 1)
    return q_all.gather(-1, index).squeeze(-1)


# --- a team's centralized critics (Lowe et al. 2017, "Multi-agent actor-critic for mixed
# cooperative-competitive environments"): MADDPG's and CTEDD's -----------------------------


def critic_inputs(critic_obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """``[M, C + D]``: what every centralized critic sees, the observations (or state)
    ``[M, C]`` and all agents' actions (``[M, D]``, or ``[M, N, action_dim]``)."""
    return torch.cat([critic_obs, actions.flatten(1)], dim=-1)


def replace_own_actions(
    critic_obs: torch.Tensor, replayed: torch.Tensor, policy: torch.Tensor, own: torch.Tensor
) -> torch.Tensor:
    """``[N, M, C + D]``: critic ``i``'s input with agent ``i``'s replayed action replaced by
    its policy's action (Lowe et al. 2017, Algorithm 1, actor update); ``replayed`` and
    ``policy`` are joint actions ``[M, D]``, ``own`` ``[N, D]`` marks each agent's columns."""
    actions = torch.where(own.unsqueeze(1), policy.unsqueeze(0), replayed.unsqueeze(0))
    obs = critic_obs.unsqueeze(0).expand(own.shape[0], -1, -1)
    return torch.cat([obs, actions], dim=-1)


def own_action_inputs(
    critic_obs: torch.Tensor, replayed: torch.Tensor, policy: torch.Tensor
) -> torch.Tensor:
    """`replace_own_actions` for agents with equal action sizes: ``replayed`` and ``policy``
    ``[M, N, action_dim]``."""
    n, d = replayed.shape[1:]
    own = torch.eye(n, dtype=torch.bool, device=replayed.device).repeat_interleave(d, dim=1)
    return replace_own_actions(critic_obs, replayed.flatten(1), policy.flatten(1), own)
