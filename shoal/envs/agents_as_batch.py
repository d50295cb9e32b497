"""A multi-agent env seen as a single-agent vector env whose batch is (env, agent) pairs.

Shared-weight learners (the "PPO with shared weights" of Biswas and Biswas, "Autonomous driving
using Multi-Agent RL"; IPPO; MAPPO) treat every agent of a group as one more row of the batch:
DESIGN.md's ``[T, B, N, ...]`` flattened to
``[T, B*N, ...]``. `AgentsAsBatch` does that flattening once, at the env boundary, so PPO's
runner, storage, return estimators, update, checkpoints and evaluation work unchanged.

Observations per row are the agent's own observation, optionally followed by a one-hot agent
index (``env.agent_id``). With ``env.global_state`` the observation space becomes a
``Dict(actor=..., critic=...)`` whose arrays are the flat concatenation of the two parts: the
actor part is what the agent sees, the critic part is the env's global state (plus the agent
one-hot), which only the value function reads (MAPPO's centralized critic; the actor never
sees it, so execution stays decentralized).

An agent that is done while its env continues is masked: its rows are marked as autoreset
steps (not real transitions), exactly like the step that resets a finished single-agent env.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from shoal.core.errors import ConfigError, UnsupportedSpaceError
from shoal.core.types import StepResult
from shoal.envs.multi_agent import MultiAgentStep, MultiAgentVectorEnv, episode_ended
from shoal.envs.opponents import make_opponents
from shoal.envs.shapes import shape_of


def split_observation(space: gym.Space) -> tuple[int, int] | None:
    """``(actor features, critic features)`` of an observation space with a critic-only part
    (a ``Dict`` with keys ``actor`` and ``critic``), else None."""
    if isinstance(space, gym.spaces.Dict) and set(space.spaces) == {"actor", "critic"}:
        return int(np.prod(shape_of(space["actor"]))), int(np.prod(shape_of(space["critic"])))
    return None


def critic_part(space: gym.Space | None) -> int:
    """Columns of a centralized critic's input at the end of a MAPPO-style row (`AgentRows`
    with ``global_state``, stored as one flat row); 0 for other spaces."""
    split = None if space is None else split_observation(space)
    return 0 if split is None else split[1]


def actor_space(space: gym.Space) -> gym.Space:
    """What a deployed policy reads: the actor's part of a MAPPO-style row (the space itself
    for others)."""
    if isinstance(space, gym.spaces.Dict) and critic_part(space):
        return space["actor"]
    return space


class AgentRows:
    """The rows a shared policy sees for ``num_agents`` agents with one observation space:
    each agent's own observation, flat, then its one-hot index (``agent_id``); with
    ``global_state``, a critic-only part follows: the env's global state (and the one-hot).
    ``observation_space`` describes one row (a ``Dict(actor=..., critic=...)`` with a critic
    part, whose arrays are the flat concatenation of the two)."""

    def __init__(
        self,
        observation_space: gym.Space,
        num_agents: int,
        state_space: gym.Space | None,
        agent_id: bool,
        global_state: bool,
    ):
        if not isinstance(observation_space, gym.spaces.Box):
            raise UnsupportedSpaceError(
                f"agent observation space {observation_space} is not supported; "
                "shared-weight learners need Box observations"
            )
        if global_state and state_space is None:
            raise ConfigError("env.global_state is on but this env provides no global state")
        self.ids = np.eye(num_agents, dtype=np.float32) if agent_id else None
        self.global_state = global_state
        id_dim = num_agents if agent_id else 0
        actor_dim = int(np.prod(shape_of(observation_space))) + id_dim
        actor_space = gym.spaces.Box(-np.inf, np.inf, (actor_dim,), np.float32)
        self.observation_space: gym.Space = actor_space
        if global_state:
            if state_space is None:
                raise ConfigError("global_state needs an env with a global state (state_space)")
            critic_dim = int(np.prod(shape_of(state_space))) + id_dim
            critic_space = gym.spaces.Box(-np.inf, np.inf, (critic_dim,), np.float32)
            self.observation_space = gym.spaces.Dict(actor=actor_space, critic=critic_space)

    def rows(self, own: np.ndarray, state: np.ndarray | None) -> np.ndarray:
        """``[B * N, features]`` rows from the agents' observations ``[B, N, ...]`` and the
        global state ``[B, S]`` (read only with ``global_state``)."""
        own = np.asarray(own).astype(np.float32, copy=False)
        batch, agents = own.shape[:2]
        parts = [own.reshape(batch, agents, -1)]
        ids = None
        if self.ids is not None:
            ids = np.broadcast_to(self.ids, (batch, agents, agents))
            parts.append(ids)
        if self.global_state:
            assert state is not None, "global_state rows need the env's state"
            parts.append(np.broadcast_to(state[:, None, :], (batch, agents, state.shape[-1])))
            if ids is not None:
                parts.append(ids)
        return np.concatenate(parts, axis=-1).reshape(batch * agents, -1)


class AgentsAsBatch:
    """`VectorEnv` over the ``B * N`` (env, agent) pairs of one agent group.

    Args:
        env: the multi-agent vector env.
        group: the group to present (None: the env's only group).
        agent_id: append a one-hot agent index to each agent's observation (and critic input).
        global_state: add the env's global state as a critic-only observation part.
        opponents: ``{group: spec}`` fixed policies for the other groups
            (`shoal.envs.opponents`: ``random`` or a scripted ``module:Class``).
    """

    def __init__(
        self,
        env: MultiAgentVectorEnv,
        group: str | None = None,
        agent_id: bool = False,
        global_state: bool = False,
        opponents: Mapping[str, str] | None = None,
    ):
        opponents = dict(opponents or {})
        if group is None:
            learners = [name for name in env.groups if name not in opponents]
            if len(learners) != 1:
                raise ConfigError(
                    f"this env has agent groups {list(env.groups)}; a single-agent learner on "
                    "rows of agents trains one group: set env.group to one of them (and "
                    "env.opponents for the others), or train every group with mappo or ippo"
                )
            group = learners[0]
        if group not in env.groups:
            raise ConfigError(f"env.group {group!r} is not one of {list(env.groups)}")
        others = [name for name in env.groups if name != group and name not in opponents]
        if others:
            spec = ",".join(f"{name}:random" for name in others)
            raise ConfigError(
                f"env.group {group!r}: the other groups {others} would have no policy; "
                "shared-weight learners train one group: give the others a fixed one with "
                f"env.opponents (--env.opponents {spec.replace(':', ' ')}, or a scripted "
                "module:Class)"
            )
        self.opponents = make_opponents(opponents, env.groups, group)
        members = env.groups[group]
        self.layout = AgentRows(
            members.observation_space, members.size, env.state_space, agent_id, global_state
        )
        self.env, self.group = env, group
        self.agents_per_env = members.size
        self.agent_names = members.agents
        self.num_envs = env.num_envs * members.size
        self.action_space = members.action_space
        self.observation_space: gym.Space = self.layout.observation_space
        self.action_mask: np.ndarray | None = None
        self._raw_obs: dict[str, np.ndarray] = {}
        self._raw_masks: dict[str, np.ndarray] | None = None
        """The latest observations and masks of every group (the opponents act on them)."""
        self._returns = np.zeros(self.num_envs)
        self._lengths = np.zeros(self.num_envs, np.int64)

    def _rows(self, obs: dict[str, np.ndarray], state: np.ndarray | None) -> np.ndarray:
        return self.layout.rows(obs[self.group], state)

    def _set_mask(self, mask: dict[str, np.ndarray] | None) -> None:
        self._raw_masks = mask
        self.action_mask = None if mask is None else mask[self.group].reshape(self.num_envs, -1)

    def reset(self, seed: int | None = None) -> np.ndarray:
        obs, state = self.env.reset(seed=seed)
        for i, opponent in enumerate(self.opponents.values()):
            if hasattr(opponent, "reset"):  # its own stream, derived from the env's seed
                opponent.reset(None if seed is None else seed + 104_729 * (i + 1))
        self._raw_obs = obs
        self._returns[:] = 0.0
        self._lengths[:] = 0
        self._set_mask(getattr(self.env, "action_mask", None))
        return self._rows(obs, state)

    def step(self, actions: np.ndarray) -> StepResult:
        batch, agents = self.env.num_envs, self.agents_per_env
        actions = np.asarray(actions).reshape(batch, agents, *shape_of(self.action_space))
        joint = {self.group: actions}
        masks = self._raw_masks
        for name, opponent in self.opponents.items():
            joint[name] = opponent.act(self._raw_obs[name], None if masks is None else masks[name])
        result: MultiAgentStep = self.env.step(joint)
        self._raw_obs = result.obs
        flat = {
            name: getattr(result, name)[self.group].reshape(-1)
            for name in ("rewards", "terminated", "truncated", "active")
        }
        # An agent's episode ends at its own terminal or truncated step: report its return
        # there, from what it collected while active.
        self._returns += flat["rewards"]
        self._lengths += flat["active"]
        done = np.flatnonzero(flat["terminated"] | flat["truncated"])
        returns, lengths = self._returns[done].copy(), self._lengths[done].copy()
        self._returns[done] = 0.0
        self._lengths[done] = 0
        self._set_mask(result.action_mask)
        return StepResult(
            obs=self._rows(result.obs, result.state),
            reward=flat["rewards"].astype(np.float32, copy=False),
            terminated=flat["terminated"],
            truncated=flat["truncated"],
            autoreset=~flat["active"],
            episode_returns=returns,
            episode_lengths=lengths,
            action_mask=self.action_mask,
            episode_agents=done % agents,
            episode_info=result.episode_info,
            episode_info_rows=None
            if result.episode_info is None
            else np.flatnonzero(episode_ended(result)) * agents,
        )

    def get_state(self) -> dict[str, Any]:
        return {
            "env": self.env.get_state(),
            "returns": self._returns.copy(),
            "lengths": self._lengths.copy(),
            "raw_obs": {name: obs.copy() for name, obs in self._raw_obs.items()},
            "raw_masks": None
            if self._raw_masks is None
            else {name: mask.copy() for name, mask in self._raw_masks.items()},
            "opponents": {
                name: opponent.get_state()
                for name, opponent in self.opponents.items()
                if hasattr(opponent, "get_state")
            },
        }

    def set_state(self, state: dict[str, Any]) -> None:
        self.env.set_state(state["env"])
        self._raw_obs = {name: np.array(obs) for name, obs in state.get("raw_obs", {}).items()}
        masks = state.get("raw_masks")
        self._set_mask(None if masks is None else {k: np.array(v) for k, v in masks.items()})
        for name, opponent_state in state.get("opponents", {}).items():
            self.opponents[name].set_state(opponent_state)
        self._returns[:] = state["returns"]
        self._lengths[:] = state["lengths"]

    def render(self) -> np.ndarray | None:
        return self.env.render()

    def close(self) -> None:
        self.env.close()
