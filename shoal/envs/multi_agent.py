"""The multi-agent vector-environment protocol: agents grouped by shared spaces, arrays with an
agent axis.

A multi-agent env steps ``num_envs`` copies of a world at once. Its agents form *groups*:
agents of a group share observation and action spaces (and, in shared-weight learners, a
policy). Every per-agent array of a group is ``[B, N_group, ...]``, agents in the group's order.
An optional global state ``[B, S]`` describes the whole world, for centralized critics.

Episodes and resets follow the single-agent convention of `shoal.core.types.StepResult`
(Gymnasium's *next-step* autoreset): an env whose episode ended returns the true final
observations, and its next ``step`` resets it, ignores the actions and sets ``autoreset``. An
agent that is done while others continue stays in the arrays with ``active`` False (its
observation frozen, its reward 0) until its env resets: masked, not dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, runtime_checkable

import gymnasium as gym
import numpy as np

if TYPE_CHECKING:
    from shoal.config import EnvConfig


class AgentGroup(NamedTuple):
    """Agents with the same spaces, in the order of the group's agent axis."""

    name: str
    agents: tuple[str, ...]
    observation_space: gym.Space
    """One agent's observation space."""
    action_space: gym.Space
    """One agent's action space."""

    @property
    def size(self) -> int:
        return len(self.agents)


class MultiAgentStep(NamedTuple):
    """What `MultiAgentVectorEnv.step` returns; ``dict``s map group names to arrays."""

    obs: dict[str, np.ndarray]
    """``[B, N, *obs_shape]`` observations after the step (final ones where episodes ended)."""
    rewards: dict[str, np.ndarray]
    """``[B, N]`` float32 rewards of the step (0 for inactive agents and autoreset steps)."""
    terminated: dict[str, np.ndarray]
    """``[B, N]`` bool: the agent's episode reached a terminal state on this step."""
    truncated: dict[str, np.ndarray]
    """``[B, N]`` bool: the agent's episode was cut (time limit) on this step."""
    active: dict[str, np.ndarray]
    """``[B, N]`` bool: the agent acted on this step (False after it was done, and on
    autoreset steps, where nothing is real)."""
    autoreset: np.ndarray
    """``[B]`` bool: this step reset the env (next-step autoreset) and ignored its actions."""
    state: np.ndarray | None
    """``[B, S]`` global state after the step, or None when the env has none."""
    episode_returns: dict[str, np.ndarray]
    """Per agent id: undiscounted returns of the episodes that ended on this step, ``[k]``,
    aligned with ``episode_lengths``."""
    episode_lengths: np.ndarray
    """``[k]`` lengths (env steps) of the episodes that ended on this step."""
    action_mask: dict[str, np.ndarray] | None = None
    """``[B, N, A]`` bool legal actions at ``obs`` per group, or None."""
    episode_info: dict[str, np.ndarray] | None = None
    """Statistics of the env episodes that ended on this step, ``{name: [k]}`` aligned with
    ``episode_lengths`` (e.g. the share of agents that collided), or None."""


@runtime_checkable
class MultiAgentVectorEnv(Protocol):
    """A batch of ``num_envs`` multi-agent worlds stepped together (see the module doc)."""

    num_envs: int
    groups: dict[str, AgentGroup]
    """Groups by name, in a fixed order."""
    state_space: gym.Space | None
    """Space of the global state of one env, or None."""

    def reset(self, seed: int | None = None) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
        """Reset every env; returns the observations per group ``[B, N, ...]`` and the global
        state ``[B, S]`` (or None)."""
        ...

    def step(self, actions: dict[str, np.ndarray]) -> MultiAgentStep:
        """Actions per group ``[B, N, *action_shape]``; entries of inactive agents and of envs
        being reset are ignored."""
        ...

    def render(self) -> np.ndarray | None:
        """An RGB frame ``[H, W, 3]`` of the first env, or None."""
        ...

    def get_state(self) -> dict[str, Any]:
        """Everything needed to continue mid-episode, or raise
        `shoal.envs.snapshot.EnvStateUnsupported`."""
        ...

    def set_state(self, state: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def episode_ended(step: MultiAgentStep) -> np.ndarray:
    """``[B]`` bool: the env's episode ended on ``step``: a real step (not an autoreset)
    after which every agent of every group is terminated, truncated or inactive."""
    done = [
        (step.terminated[g] | step.truncated[g] | ~step.active[g]).all(axis=-1)
        for g in step.terminated
    ]
    return np.logical_and.reduce(done) & ~step.autoreset


def agent_names(env: MultiAgentVectorEnv) -> list[str]:
    """Every agent id, group by group."""
    return [agent for group in env.groups.values() for agent in group.agents]


class EpisodeTracker:
    """Per-agent returns and lengths of running episodes, for envs that compute their own
    rewards: `update` adds a step's rewards and returns the finished episodes' statistics.
    Built-in envs and adapters share it so per-agent returns mean the same everywhere."""

    def __init__(self, num_envs: int, groups: dict[str, AgentGroup]):
        self.groups = groups
        self.returns = {name: np.zeros((num_envs, g.size)) for name, g in groups.items()}
        self.lengths = np.zeros(num_envs, np.int64)

    def update(
        self, rewards: dict[str, np.ndarray], counted: np.ndarray, ended: np.ndarray
    ) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Add ``rewards`` (per group ``[B, N]``) of envs where ``counted`` ``[B]`` (not
        autoreset steps); for the envs whose episode ``ended`` ``[B]`` on this step, return
        ``({agent id: returns [k]}, lengths [k])`` and restart their sums."""
        self.lengths += counted
        for name, group_rewards in rewards.items():
            self.returns[name] += group_rewards
        finished: dict[str, np.ndarray] = {}
        for name, group in self.groups.items():
            done = self.returns[name][ended]
            for index, agent in enumerate(group.agents):
                finished[agent] = done[:, index].copy()
            self.returns[name][ended] = 0.0
        lengths = self.lengths[ended].copy()
        self.lengths[ended] = 0
        return finished, lengths

    def state_dict(self) -> dict[str, Any]:
        return {
            "returns": {k: v.copy() for k, v in self.returns.items()},
            "lengths": self.lengths.copy(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name in self.returns:
            self.returns[name][:] = state["returns"][name]
        self.lengths[:] = state["lengths"]


MultiAgentFactory = Callable[["EnvConfig"], MultiAgentVectorEnv]
_FACTORIES: dict[str, MultiAgentFactory] = {}
PETTINGZOO_PREFIX = "pettingzoo:"


def register_multi_agent_env(env_id: str, factory: MultiAgentFactory) -> None:
    """Make ``env_id`` buildable by `make_multi_agent_env`; ``factory(env_config)`` reads
    ``num_envs``, ``kwargs`` and ``max_episode_steps`` from the `EnvConfig`."""
    _FACTORIES[env_id] = factory


def is_multi_agent_id(env_id: str) -> bool:
    return env_id in _FACTORIES or env_id.startswith(PETTINGZOO_PREFIX)


def multi_agent_ids() -> list[str]:
    return sorted(_FACTORIES)


def registered_factory(env_id: str) -> MultiAgentFactory | None:
    """The factory `register_multi_agent_env` registered for ``env_id``, or None."""
    return _FACTORIES.get(env_id)
