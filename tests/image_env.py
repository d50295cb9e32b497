"""A tiny image env for tests of the image encoders: uint8 frames, three actions."""

import gymnasium as gym
import numpy as np


class FakeImageEnv(gym.Env):
    """uint8 ``[4, 84, 84]`` observations, three actions, 12-step episodes."""

    observation_space = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    action_space = gym.spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        reward = float(action == self.t % 3)
        return self._obs(), reward, self.t >= 12, False, {}

    def _obs(self):
        return self.np_random.integers(0, 256, self.observation_space.shape, np.uint8)
