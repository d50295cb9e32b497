"""Small cooperative matrix games for testing multi-agent value factorization.

``shoal/two-step-v0`` is the two-step game that motivates QMIX (Rashid et al. 2018, "QMIX:
Monotonic Value Function Factorisation for Deep Multi-Agent Reinforcement Learning", Figure 3;
RLlib ships it as its QMIX example). Two agents ``agent_0`` and ``agent_1`` (one group,
``agent``) each choose between 2 actions, for two steps:

* Step 1, in state 1: ``agent_0``'s action picks the next state, 2A (action 0) or 2B
  (action 1); ``agent_1``'s action does nothing. Reward 0.
* Step 2: in 2A every joint action pays 7; in 2B the payoff is ``[[0, 1], [1, 8]]`` (rows
  ``agent_0``'s action, columns ``agent_1``'s). The episode then terminates.

Both agents receive the same team reward. The optimal joint return is 8 (go to 2B, then both
play 1); the safe return is 7 (go to 2A). Independent or greedy learners, and VDN's additive
factorization, typically settle on 7, because from 2B a lone agent playing 1 earns 8 only if the
other does too; QMIX's monotonic mixing can represent the values needed to reach 8.

Observations are ``[B, 2, 3]`` float32: the one-hot of the current state (1, 2A, 2B), the same
for both agents; with ``agent_id=True`` a one-hot of the agent index is appended (5 dims). The
final observation of an episode (after step 2) is all zeros in the state part (terminal). The
global state ``[B, 3]`` is the same state one-hot. The game is deterministic; ``reset``'s seed is
accepted and ignored. Episodes auto-reset on the next step (see `shoal.envs.multi_agent`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from shoal.core.errors import ConfigError
from shoal.envs.multi_agent import (
    AgentGroup,
    EpisodeTracker,
    MultiAgentStep,
    register_multi_agent_env,
)

if TYPE_CHECKING:
    from shoal.config import EnvConfig

__all__ = ["TWO_STEP_ID", "TwoStepGame", "make_two_step_env"]

TWO_STEP_ID = "shoal/two-step-v0"

STATE_1, STATE_2A, STATE_2B, TERMINAL = 0, 1, 2, 3
"""Internal state codes; the one-hot has a slot for the first three (terminal is all zeros)."""
PAYOFF_2A = np.full((2, 2), 7.0, np.float32)
PAYOFF_2B = np.array([[0.0, 1.0], [1.0, 8.0]], np.float32)
GROUP = "agent"
AGENTS = ("agent_0", "agent_1")


class TwoStepGame:
    """``num_envs`` copies of the two-step game (see the module doc), vectorized with numpy."""

    def __init__(
        self, num_envs: int = 1, agent_id: bool = False, max_episode_steps: int | None = None
    ):
        if num_envs < 1:
            raise ConfigError(f"num_envs = {num_envs} is invalid: must be >= 1")
        self.num_envs = num_envs
        self.agent_id = bool(agent_id)
        self.max_episode_steps = max_episode_steps
        obs_dim = 3 + (len(AGENTS) if self.agent_id else 0)
        self.groups = {
            GROUP: AgentGroup(
                GROUP,
                AGENTS,
                gym.spaces.Box(0.0, 1.0, (obs_dim,), np.float32),
                gym.spaces.Discrete(2),
            )
        }
        self.state_space: gym.Space | None = gym.spaces.Box(0.0, 1.0, (3,), np.float32)
        self._state = np.full(num_envs, STATE_1, np.int64)
        self._t = np.zeros(num_envs, np.int64)
        self._needs_reset = np.zeros(num_envs, bool)
        self._tracker = EpisodeTracker(num_envs, self.groups)

    def _global_state(self) -> np.ndarray:
        onehot = np.zeros((self.num_envs, 4), np.float32)
        onehot[np.arange(self.num_envs), self._state] = 1.0
        return onehot[:, :3]

    def _obs(self) -> dict[str, np.ndarray]:
        state = self._global_state()
        obs = np.repeat(state[:, None, :], len(AGENTS), axis=1)
        if self.agent_id:
            ids = np.broadcast_to(np.eye(len(AGENTS), dtype=np.float32), obs.shape[:2] + (2,))
            obs = np.concatenate([obs, ids], axis=-1)
        return {GROUP: obs}

    def reset(self, seed: int | None = None) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
        del seed  # deterministic
        self._state[:] = STATE_1
        self._t[:] = 0
        self._needs_reset[:] = False
        self._tracker = EpisodeTracker(self.num_envs, self.groups)
        return self._obs(), self._global_state()

    def step(self, actions: dict[str, np.ndarray]) -> MultiAgentStep:
        b = self.num_envs
        acts = np.asarray(actions[GROUP]).reshape(b, len(AGENTS)).astype(np.int64)
        if ((acts < 0) | (acts > 1)).any():
            raise ValueError(f"two-step game actions must be 0 or 1, got {acts.tolist()}")
        autoreset = self._needs_reset.copy()
        playing = ~autoreset
        reward = np.zeros(b, np.float32)

        first = playing & (self._t == 0)
        second = playing & (self._t == 1)
        a0, a1 = acts[:, 0], acts[:, 1]
        reward[second] = np.where(
            self._state[second] == STATE_2A,
            PAYOFF_2A[a0[second], a1[second]],
            PAYOFF_2B[a0[second], a1[second]],
        )
        self._state[first] = np.where(a0[first] == 0, STATE_2A, STATE_2B)
        self._state[second] = TERMINAL
        self._t[playing] += 1
        terminated = second
        truncated = playing & ~terminated
        if self.max_episode_steps is not None:
            truncated &= self._t >= self.max_episode_steps
        else:
            truncated[:] = False
        ended = terminated | truncated

        self._state[autoreset] = STATE_1
        self._t[autoreset] = 0
        self._needs_reset = ended

        n = len(AGENTS)
        rewards = {GROUP: np.repeat(reward[:, None], n, axis=1)}
        returns, lengths = self._tracker.update(rewards, playing, ended)
        return MultiAgentStep(
            obs=self._obs(),
            rewards=rewards,
            terminated={GROUP: np.repeat(terminated[:, None], n, axis=1)},
            truncated={GROUP: np.repeat(truncated[:, None], n, axis=1)},
            active={GROUP: np.repeat(playing[:, None], n, axis=1)},
            autoreset=autoreset,
            state=self._global_state(),
            episode_returns=returns,
            episode_lengths=lengths,
        )

    def render(self) -> np.ndarray | None:
        return None

    def get_state(self) -> dict[str, Any]:
        return {
            "state": self._state.copy(),
            "t": self._t.copy(),
            "needs_reset": self._needs_reset.copy(),
            "tracker": self._tracker.state_dict(),
        }

    def set_state(self, state: dict[str, Any]) -> None:
        self._state[:] = np.asarray(state["state"])
        self._t[:] = np.asarray(state["t"])
        self._needs_reset[:] = np.asarray(state["needs_reset"], bool)
        self._tracker.load_state_dict(state["tracker"])

    def close(self) -> None:
        pass


def make_two_step_env(config: EnvConfig) -> TwoStepGame:
    """Factory for `register_multi_agent_env`: ``kwargs`` may set ``agent_id`` (bool)."""
    unknown = sorted(set(config.kwargs) - {"agent_id"})
    if unknown:
        raise ConfigError(
            f"env.kwargs {', '.join(unknown)} not understood by {TWO_STEP_ID} "
            "(it takes agent_id: bool)"
        )
    return TwoStepGame(
        config.num_envs,
        agent_id=bool(config.kwargs.get("agent_id", False)),
        max_episode_steps=config.max_episode_steps,
    )


register_multi_agent_env(TWO_STEP_ID, make_two_step_env)
