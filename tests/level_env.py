"""An env with a curriculum knob, for the callback tests: every step pays ``level``.

Importing the module registers ``LevelEnv-v0``; the id ``level_env:LevelEnv-v0`` imports it in
whichever process builds the env (Ray runners included)."""

import gymnasium as gym
import numpy as np


class LevelEnv(gym.Env):
    """Every step pays ``level`` (an attribute a curriculum sets); 4-step episodes."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)
    level = 0.0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.zeros(2, np.float32), float(self.level), False, self.t >= 4, {}


if "LevelEnv-v0" not in gym.registry:
    gym.register("LevelEnv-v0", entry_point=LevelEnv)
