"""Decentralized actors of a group of agents (MADDPG): each agent acts on its own observation.

`MultiAgentActor` evaluates the ``N`` actors of a group at once. With separate parameters the
``N`` networks are one `ParallelMLP` (one batched matmul per layer for all agents); with shared
parameters one network sees every agent's observation plus its one-hot index.

Continuous actions are deterministic, ``tanh`` in ``[-1, 1]^d`` (the particle worlds' action
box), and explore with additive Gaussian or Ornstein-Uhlenbeck noise. Discrete actions use the
Gumbel-softmax (Jang et al. 2017; Lowe et al. 2017's discrete MADDPG): acting samples a one-hot
action from ``softmax((logits + Gumbel noise) / temperature)``, and the actor's loss reaches the
logits through the straight-through estimator (one-hot forward, softmax gradient backward).

Inputs are ``[B, N, obs_dim]``; a deployed policy (`shoal.nn.policy.ActorPolicy`) passes the rows
of `shoal.envs.agents_as_batch.AgentsAsBatch`, ``[B * N, obs_dim]`` in agent order, which
``distribution`` folds back to ``[B, N, obs_dim]``.
"""

from __future__ import annotations

from collections.abc import Sequence

import gymnasium as gym
import torch
from torch import nn
from torch.nn import functional as F

from shoal.config import ModelConfig, NoiseConfig
from shoal.core.errors import UnsupportedSpaceError
from shoal.envs.multi_agent import AgentGroup
from shoal.nn.actor_critic import ActOutput
from shoal.nn.actors import ActionChoice, make_noise
from shoal.nn.init import POLICY_GAIN, linear
from shoal.nn.mlp import ParallelMLP


class MultiAgentActor(nn.Module):
    """The actors of one agent group.

    Args:
        obs_space: one agent's observation space (a 1-D Box).
        action_space: one agent's action space: ``Discrete`` or a ``Box`` within ``[-1, 1]``.
        num_agents: agents in the group (``N``).
        model: hidden sizes and activation.
        noise: exploration noise of continuous actions.
        share_parameters: one network for all agents (agent one-hot appended to its input).
        gumbel_temperature: temperature of the Gumbel-softmax (discrete actions).
    """

    random_actions: torch.Tensor
    ids: torch.Tensor

    def __init__(
        self,
        obs_space: gym.Space,
        action_space: gym.Space,
        num_agents: int,
        model: ModelConfig,
        noise: NoiseConfig,
        share_parameters: bool = False,
        gumbel_temperature: float = 1.0,
    ):
        super().__init__()
        if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) != 1:
            raise UnsupportedSpaceError(f"MADDPG needs 1-D Box observations, got {obs_space}")
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        if isinstance(action_space, gym.spaces.Discrete):
            self.action_dim = int(action_space.n)
        elif isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1:
            if (action_space.low < -1).any() or (action_space.high > 1).any():
                raise UnsupportedSpaceError(
                    f"MADDPG's continuous actors act in [-1, 1]; the env's {action_space} is wider"
                )
            self.action_dim = action_space.shape[0]
        else:
            raise UnsupportedSpaceError(
                f"MADDPG needs Discrete or 1-D Box actions, got {action_space}"
            )
        self.num_agents = num_agents
        self.obs_dim = obs_space.shape[0]
        self.share_parameters = share_parameters
        self.gumbel_temperature = gumbel_temperature
        members = 1 if share_parameters else num_agents
        in_dim = self.obs_dim + (num_agents if share_parameters else 0)
        self.body = ParallelMLP(in_dim, model.hidden, model.activation, members)
        weight = torch.stack(
            [
                linear(self.body.out_dim, self.action_dim, POLICY_GAIN).weight.detach().T
                for _ in range(members)
            ]
        )
        self.out_weight = nn.Parameter(weight.contiguous())
        self.out_bias = nn.Parameter(torch.zeros(members, 1, self.action_dim))
        self.register_buffer("random_actions", torch.tensor(True))
        self.register_buffer("ids", torch.eye(num_agents))
        self.noise = make_noise(noise)

    def logits(self, obs: torch.Tensor) -> torch.Tensor:
        """``[B, N, obs_dim]`` -> ``[B, N, action_dim]`` pre-activations (logits, or the
        pre-``tanh`` actions)."""
        batch = obs.shape[0]
        if self.share_parameters:
            ids = self.ids.expand(batch, -1, -1)
            x = torch.cat([obs.float(), ids], dim=-1).reshape(1, -1, self.obs_dim + self.num_agents)
        else:
            x = obs.float().transpose(0, 1)  # [N, B, obs_dim]: one member per agent
        out = torch.baddbmm(self.out_bias, self.body(x), self.out_weight)
        if self.share_parameters:
            return out.reshape(batch, self.num_agents, self.action_dim)
        return out.transpose(0, 1)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Differentiable actions for the actor's loss: ``tanh`` actions, or straight-through
        Gumbel-softmax one-hots (discrete), ``[B, N, action_dim]``."""
        return self.actions_of(self.logits(obs))

    def actions_of(self, logits: torch.Tensor) -> torch.Tensor:
        """`forward` from the pre-activations `logits` returns."""
        if self.discrete:
            return F.gumbel_softmax(logits, tau=self.gumbel_temperature, hard=True)
        return torch.tanh(logits)

    def target_actions(self, obs: torch.Tensor) -> torch.Tensor:
        """Actions of a target actor for the bootstrap: ``tanh`` actions, or Gumbel-softmax
        one-hot samples (as the MADDPG authors' code), ``[B, N, action_dim]``."""
        return self(obs)

    # --- acting ------------------------------------------------------------------------------

    def greedy(self, obs: torch.Tensor) -> torch.Tensor:
        """Env actions without exploration: ``[B, N]`` indices or ``[B, N, d]`` values."""
        logits = self.logits(obs)
        return logits.argmax(dim=-1) if self.discrete else torch.tanh(logits)

    def explore(self, obs: torch.Tensor) -> torch.Tensor:
        logits = self.logits(obs)
        if self.discrete:
            return F.gumbel_softmax(logits, tau=self.gumbel_temperature, hard=True).argmax(-1)
        actions = torch.tanh(logits)
        return (actions + self.noise(actions)).clamp(-1.0, 1.0)

    def uniform(self, obs: torch.Tensor) -> torch.Tensor:
        """Uniformly random env actions for ``[B, N, obs_dim]`` observations, on their
        device."""
        batch, device = obs.shape[0], obs.device
        if self.discrete:
            return torch.randint(self.action_dim, (batch, self.num_agents), device=device)
        return torch.rand(batch, self.num_agents, self.action_dim, device=device) * 2 - 1

    def act_joint(self, obs: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        """Env actions for ``[B, N, obs_dim]`` observations."""
        if deterministic:
            return self.greedy(obs)
        return self.uniform(obs) if self.random_actions else self.explore(obs)

    def one_hot(self, actions: torch.Tensor) -> torch.Tensor:
        """Env actions as the critic's action input: one-hot for discrete, as is otherwise."""
        if self.discrete:
            return F.one_hot(actions.long(), self.action_dim).float()
        return actions.float()

    def distribution(self, obs: torch.Tensor) -> ActionChoice:
        """For `ActorPolicy`: ``[B * N, obs_dim]`` rows in agent order -> ``[B * N, ...]``."""
        joint = obs.reshape(-1, self.num_agents, self.obs_dim)

        def rows(actions: torch.Tensor) -> torch.Tensor:
            return actions.reshape(obs.shape[0], *actions.shape[2:])

        return ActionChoice(
            lambda: rows(self.act_joint(joint, deterministic=True)),
            lambda: rows(self.act_joint(joint)),
        )

    def act(self, obs: torch.Tensor, deterministic: bool = False) -> ActOutput:
        actions = (
            self.distribution(obs).mode() if deterministic else self.distribution(obs).sample()
        )
        zeros = torch.zeros(obs.shape[0], device=obs.device)
        return ActOutput(actions, zeros, zeros)

    def exploration_state(self) -> torch.Tensor | None:
        return self.noise.state()

    def load_exploration_state(self, state: torch.Tensor | None) -> None:
        self.noise.load_state(state)


class JointActors(nn.Module):
    """The actors of every agent group of an env, one `MultiAgentActor` per group, seen as
    one agent axis: the groups in order, each group's agents in order (MADDPG's mixed
    cooperative-competitive games, where every agent's critic sees all agents).

    Joint observations are a dict of ``[B, N_g, obs_dim_g]`` per group; joint actions for the
    critics are one flat ``[B, D]`` row, each agent's ``action_dim`` columns in agent order
    (how MADDPG's replay stores them: `shoal.algos.multi_agent.joint_replay.JointLayout`).

    Args:
        groups: the agent groups (name, agents and one agent's spaces each).
        model, noise, share_parameters, gumbel_temperature: as for `MultiAgentActor`
            (``share_parameters`` shares within a group, never across groups).
    """

    own_columns: torch.Tensor
    random_actions: torch.Tensor

    def __init__(
        self,
        groups: Sequence[AgentGroup],
        model: ModelConfig,
        noise: NoiseConfig,
        share_parameters: bool = False,
        gumbel_temperature: float = 1.0,
    ):
        super().__init__()
        self.groups = {
            g.name: MultiAgentActor(
                g.observation_space,
                g.action_space,
                g.size,
                model,
                noise,
                share_parameters,
                gumbel_temperature,
            )
            for g in groups
        }
        self.actors = nn.ModuleDict(self.groups)
        self.agent_names = [agent for g in groups for agent in g.agents]
        self.num_agents = len(self.agent_names)
        actors = list(self.groups.values())
        self.obs_size = sum(a.num_agents * a.obs_dim for a in actors)
        """Columns of all agents' observations, flattened."""
        self.action_size = sum(a.num_agents * a.action_dim for a in actors)
        """Columns of the critics' joint action (``D``)."""
        own = torch.zeros(self.num_agents, self.action_size, dtype=torch.bool)
        agent, column = 0, 0
        for actor in actors:
            for _ in range(actor.num_agents):
                own[agent, column : column + actor.action_dim] = True
                agent, column = agent + 1, column + actor.action_dim
        self.register_buffer("own_columns", own)
        """``[N, D]``: the columns of each agent's own action in the joint action."""
        self.register_buffer("random_actions", torch.tensor(True))

    def forward(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """Differentiable joint actions ``[B, D]`` (each group's `MultiAgentActor.forward`)."""
        return self.actions_and_preactivations(obs)[0]

    def actions_and_preactivations(
        self, obs: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`forward`'s joint actions ``[B, D]`` and, from the same pass, the sum over agents
        of each agent's mean squared pre-activation (its logits, or its pre-``tanh`` actions):
        the term Lowe et al.'s code adds to every actor's loss (`MADDPGConfig.actor_reg`)."""
        actions: list[torch.Tensor] = []
        penalty: torch.Tensor | float = 0.0
        for name, actor in self.groups.items():
            logits = actor.logits(obs[name])  # [B, N_g, action_dim]
            actions.append(actor.actions_of(logits).flatten(1))
            penalty = penalty + logits.pow(2).mean() * actor.num_agents
        assert isinstance(penalty, torch.Tensor)  # a team has at least one group
        return torch.cat(actions, 1), penalty

    def target_actions(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        return self(obs)

    def act_joint(
        self,
        obs: dict[str, torch.Tensor],
        deterministic: bool = False,
        state: torch.Tensor | None = None,
        action_mask: dict[str, torch.Tensor] | None = None,
    ) -> dict[str, torch.Tensor]:
        """Env actions per group: greedy, uniformly random (before learning starts) or
        exploring. Each actor reads its own observation only (``state`` is not used) and
        MADDPG's actors take no action masks."""
        out = {}
        for name, actor in self.groups.items():
            x = obs[name].float()
            if deterministic:
                out[name] = actor.greedy(x)
            elif self.random_actions:
                out[name] = actor.uniform(x)
            else:
                out[name] = actor.explore(x)
        return out

    def exploration_state(self) -> dict[str, torch.Tensor | None]:
        return {name: actor.exploration_state() for name, actor in self.groups.items()}

    def load_exploration_state(self, state: dict[str, torch.Tensor | None]) -> None:
        for name, actor in self.groups.items():
            actor.load_exploration_state(state[name])
