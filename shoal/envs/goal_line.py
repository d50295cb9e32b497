"""Built-in Dict-observation task: walk to the goal on a line (a test of composite observations).

``shoal/GoalLine-v0``: the agent stands on one of ``size`` cells of a line; the observation is
``{"pos": Box(1,) float32, the position scaled to [-1, 1], "goal": Discrete(size), the goal
cell}``, both drawn at random each episode. Actions: 0 left, 1 right, 2 stop. Stopping on the
goal pays +1, stopping elsewhere -1, and both end the episode; it is truncated after
``2 * size`` steps with nothing. A policy needs both keys: without ``goal`` it cannot know
where to stop, without ``pos`` which way to go or when it has arrived; one that reads both
earns 1 every episode.

``continuous=True``: a ``Box(1,)`` action in [-1, 1] moves the agent by ``0.25 * action``
along the line [-1, 1]; the goal is a point (``Box(1,)``) and each step pays
``-|pos - goal|``, over ``4 * size`` steps.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

ENV_ID = "shoal/GoalLine-v0"
LEFT, RIGHT, STOP = 0, 1, 2


class GoalLineEnv(gym.Env):
    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, size: int = 5, continuous: bool = False):
        if size < 2:
            raise ValueError(f"size = {size} is invalid: must be >= 2")
        self.size = size
        self.continuous = continuous
        pos = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        if continuous:
            goal: gym.Space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
            self.action_space: gym.Space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
            self.limit = 4 * size
        else:
            goal = gym.spaces.Discrete(size)
            self.action_space = gym.spaces.Discrete(3)
            self.limit = 2 * size
        self.observation_space = gym.spaces.Dict({"pos": pos, "goal": goal})
        self.pos: float = 0.0
        self.goal: Any = 0
        self.t = 0

    def _obs(self) -> dict[str, Any]:
        if self.continuous:
            return {
                "pos": np.array([self.pos], np.float32),
                "goal": np.array([self.goal], np.float32),
            }
        scaled = 2.0 * self.pos / (self.size - 1) - 1.0
        return {"pos": np.array([scaled], np.float32), "goal": int(self.goal)}

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        super().reset(seed=seed)
        self.t = 0
        if self.continuous:
            self.pos = float(self.np_random.uniform(-1.0, 1.0))
            self.goal = float(self.np_random.uniform(-1.0, 1.0))
        else:
            self.pos = int(self.np_random.integers(self.size))
            self.goal = int(self.np_random.integers(self.size))
        return self._obs(), {}

    def step(self, action: Any) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        self.t += 1
        truncated = self.t >= self.limit
        if self.continuous:
            move = float(np.clip(np.asarray(action).reshape(-1)[0], -1.0, 1.0))
            self.pos = float(np.clip(self.pos + 0.25 * move, -1.0, 1.0))
            return self._obs(), -abs(self.pos - self.goal), False, truncated, {}
        action = int(action)
        if action == STOP:
            reward = 1.0 if self.pos == self.goal else -1.0
            return self._obs(), reward, True, False, {}
        self.pos = min(max(self.pos + (1 if action == RIGHT else -1), 0), self.size - 1)
        return self._obs(), 0.0, False, truncated, {}


def register() -> None:
    if ENV_ID not in gym.registry:
        gym.register(ENV_ID, entry_point=GoalLineEnv)  # type: ignore[arg-type]
