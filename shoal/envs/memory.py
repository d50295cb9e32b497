"""Built-in memory tasks, tests of recurrent policies.

``shoal/CartPoleNoVelocity-v0``: CartPole-v1 observed through the cart's position and the
pole's angle only (the velocities hidden), a partially observed task: a feed-forward policy
sees one frame and cannot tell which way the pole moves; a recurrent one can infer it from
consecutive frames (the POMDP variant of RL Zoo and sb3-contrib's RecurrentPPO benchmarks).


``shoal/RepeatFirst-v0``: the first observation of an episode shows a random cue, a one-hot
of ``num_cues``; every later observation is zeros. The episode lasts ``length`` steps and pays
+1 at the last step when the action equals the cue, else nothing. A feed-forward policy sees
the same zeros at the last step whatever the cue was, so its expected return is exactly
``1 / num_cues``; a policy that remembers the cue earns 1.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from shoal.envs.shapes import as_box

ENV_ID = "shoal/RepeatFirst-v0"
NO_VELOCITY_ID = "shoal/CartPoleNoVelocity-v0"


class RepeatFirstEnv(gym.Env):
    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, num_cues: int = 4, length: int = 8):
        if num_cues < 2:
            raise ValueError(f"num_cues = {num_cues} is invalid: must be >= 2")
        if length < 2:
            raise ValueError(f"length = {length} is invalid: must be >= 2 (else no recall)")
        self.num_cues = num_cues
        self.length = length
        self.observation_space = gym.spaces.Box(0.0, 1.0, (num_cues,), np.float32)
        self.action_space = gym.spaces.Discrete(num_cues)
        self.cue = 0
        self.t = 0

    def _obs(self) -> np.ndarray:
        obs = np.zeros(self.num_cues, np.float32)
        if self.t == 0:
            obs[self.cue] = 1.0
        return obs

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.cue = int(self.np_random.integers(self.num_cues))
        self.t = 0
        return self._obs(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.t += 1
        last = self.t >= self.length
        reward = float(last and int(action) == self.cue)
        return self._obs(), reward, last, False, {}


class HideVelocity(gym.ObservationWrapper):
    """CartPole's observation ``[x, x_dot, theta, theta_dot]`` reduced to ``[x, theta]``."""

    KEEP = np.array([0, 2])

    def __init__(self, env: gym.Env):
        super().__init__(env)
        box = as_box(env.observation_space)
        self.observation_space = gym.spaces.Box(
            box.low[self.KEEP], box.high[self.KEEP], dtype=np.float32
        )

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return observation[self.KEEP].astype(np.float32)


def cartpole_no_velocity(**kwargs: Any) -> gym.Env:
    return HideVelocity(gym.make("CartPole-v1", **kwargs).unwrapped)


def register() -> None:
    if ENV_ID not in gym.registry:
        gym.register(ENV_ID, entry_point=RepeatFirstEnv)  # type: ignore[arg-type]
    if NO_VELOCITY_ID not in gym.registry:
        gym.register(
            NO_VELOCITY_ID, entry_point=cartpole_no_velocity, max_episode_steps=500,
            reward_threshold=475.0,
        )  # fmt: skip
