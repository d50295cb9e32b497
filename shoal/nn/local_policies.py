"""CTEDD's networks (Chen 2019, "A New Framework for Multi-Agent Reinforcement Learning"): the
global policies of Figure 1 and the message-passing local policies of Figure 2.

`GlobalActor` is the deterministic part ``pi_{theta_i}(s)`` of every agent's global policy: a
shared global network on the full state (one hidden layer, section 5.2: 64 units) feeding one
local component per agent (one hidden layer of 64 units each, evaluated together as a
`ParallelMLP`), ``tanh`` actions in ``[-1, 1]^d``. `ExplorationScale` is the symmetric stochastic
part ``sigma_{omega_i}(s)``: per-agent components on the same global features. The paper trains
the shared global network with the deterministic policy gradient only (section 4.1), so the
exploration components read the global features detached.

`LocalPolicies` are the decentralized policies distilled from the global ones. Part 1 of agent
``i`` maps its own observation to a message ``m_i`` (``tanh``, ``message_dim`` numbers); the
messages are exchanged within the time step (Figure 2: "the whole process happens within every
time step"); part 2 maps the own observation and the others' messages (agent order) to the
action. Agent ``i``'s action thus depends on agent ``j``'s observation only through ``m_j``.
"""

from __future__ import annotations

import torch
from torch import nn

from shoal.nn.actor_critic import ActOutput
from shoal.nn.actors import ActionChoice
from shoal.nn.init import POLICY_GAIN, linear
from shoal.nn.mlp import ParallelMLP


class ParallelHeads(nn.Module):
    """``members`` MLPs with a linear output layer, one per agent: ``[N, B, in]`` (or ``[B,
    in]`` shared by all) -> ``[N, B, out]``."""

    def __init__(
        self, in_dim: int, hidden: tuple[int, ...], out_dim: int, members: int, gain: float
    ):
        super().__init__()
        self.body = ParallelMLP(in_dim, hidden, "relu", members)
        weight = torch.stack(
            [linear(self.body.out_dim, out_dim, gain).weight.detach().T for _ in range(members)]
        )
        self.out_weight = nn.Parameter(weight.contiguous())
        self.out_bias = nn.Parameter(torch.zeros(members, 1, out_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.baddbmm(self.out_bias, self.body(x), self.out_weight)


class GlobalActor(nn.Module):
    """Deterministic parts of the ``N`` global policies: ``[B, S]`` states -> ``[B, N, d]``."""

    random_actions: torch.Tensor

    def __init__(
        self,
        state_dim: int,
        action_dim: int,
        num_agents: int,
        global_hidden: tuple[int, ...] = (64,),
        local_hidden: tuple[int, ...] = (64,),
    ):
        super().__init__()
        self.state_dim, self.action_dim, self.num_agents = state_dim, action_dim, num_agents
        self.shared = ParallelMLP(state_dim, global_hidden, "relu", 1)
        self.feature_dim = self.shared.out_dim
        self.heads = ParallelHeads(
            self.feature_dim, local_hidden, action_dim, num_agents, POLICY_GAIN
        )
        self.register_buffer("random_actions", torch.tensor(True))

    def features(self, state: torch.Tensor) -> torch.Tensor:
        """The shared global network's output ``[B, F]``."""
        return self.shared(state.float())[0]

    def forward(self, state: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.heads(self.features(state))).transpose(0, 1)

    def target_actions(self, state: torch.Tensor) -> torch.Tensor:
        return self(state)


class ExplorationScale(nn.Module):
    """Stochastic parts ``sigma_i(s)`` on the (detached) global features: ``[B, F]`` ->
    ``[B, N, d]`` in ``(sigma_min, sigma_max)``, ``sigma_init`` at initialization."""

    def __init__(
        self,
        feature_dim: int,
        action_dim: int,
        num_agents: int,
        local_hidden: tuple[int, ...] = (64,),
        sigma_min: float = 0.01,
        sigma_max: float = 1.0,
        sigma_init: float = 0.6,
    ):
        super().__init__()
        self.sigma_min, self.sigma_max = sigma_min, sigma_max
        self.heads = ParallelHeads(feature_dim, local_hidden, action_dim, num_agents, 0.01)
        share = (sigma_init - sigma_min) / (sigma_max - sigma_min)
        with torch.no_grad():
            self.heads.out_bias.fill_(float(torch.logit(torch.tensor(share))))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        share = torch.sigmoid(self.heads(features.detach())).transpose(0, 1)
        return self.sigma_min + (self.sigma_max - self.sigma_min) * share


class LocalPolicies(nn.Module):
    """The ``N`` message-passing local policies (Figure 2), deployable on rows of agents.

    Args:
        obs_dim: one agent's observation size.
        action_dim: one agent's action size (``tanh`` actions in ``[-1, 1]``).
        num_agents: ``N``.
        message_dim: numbers per message (the paper's 1 or 3).
        hidden: hidden layers of part 1 and of part 2 (section 5.2: one layer of 64).
    """

    others: torch.Tensor

    def __init__(
        self,
        obs_dim: int,
        action_dim: int,
        num_agents: int,
        message_dim: int,
        hidden: tuple[int, ...] = (64,),
    ):
        super().__init__()
        self.obs_dim, self.action_dim = obs_dim, action_dim
        self.num_agents, self.message_dim = num_agents, message_dim
        self.speaker = (
            ParallelHeads(obs_dim, hidden, message_dim, num_agents, 1.0) if message_dim else None
        )
        in_dim = obs_dim + (num_agents - 1) * message_dim
        self.actor = ParallelHeads(in_dim, hidden, action_dim, num_agents, POLICY_GAIN)
        others = [[j for j in range(num_agents) if j != i] for i in range(num_agents)]
        self.register_buffer("others", torch.tensor(others, dtype=torch.long).view(-1, 1))

    def messages(self, obs: torch.Tensor) -> torch.Tensor:
        """Part 1: ``[B, N, obs_dim]`` -> ``[B, N, message_dim]`` in ``[-1, 1]``."""
        if self.speaker is None:
            return obs.new_zeros(*obs.shape[:2], 0)
        return torch.tanh(self.speaker(obs.float().transpose(0, 1))).transpose(0, 1)

    def received(self, messages: torch.Tensor) -> torch.Tensor:
        """``[B, N, M]`` sent -> ``[B, N, (N-1) * M]``: agent ``i`` gets the others' messages
        in agent order."""
        batch, n = messages.shape[:2]
        return messages[:, self.others.view(-1)].reshape(batch, n, (n - 1) * self.message_dim)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Part 2 after the exchange: ``[B, N, obs_dim]`` -> ``[B, N, action_dim]``."""
        obs = obs.float()
        x = torch.cat([obs, self.received(self.messages(obs))], dim=-1)
        return torch.tanh(self.actor(x.transpose(0, 1))).transpose(0, 1)

    def distribution(self, obs: torch.Tensor) -> ActionChoice:
        """For `ActorPolicy`: ``[B * N, obs_dim]`` rows in agent order -> ``[B * N, d]``
        deterministic actions (sampling is the same: local policies do not explore)."""

        def act() -> torch.Tensor:
            joint = obs.reshape(-1, self.num_agents, self.obs_dim)
            return self(joint).reshape(obs.shape[0], self.action_dim)

        return ActionChoice(act, act)

    def act(self, obs: torch.Tensor, deterministic: bool = True) -> ActOutput:
        zeros = torch.zeros(obs.shape[0], device=obs.device)
        return ActOutput(self.distribution(obs).mode(), zeros, zeros)
