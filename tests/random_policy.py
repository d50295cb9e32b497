"""A uniformly random discrete policy, the baseline of the multi-agent learning tests."""

import numpy as np


class RandomPolicy:
    def __init__(self, num_actions: int, seed: int):
        self.num_actions = num_actions
        self.rng = np.random.default_rng(seed)

    def act(self, obs, deterministic=True):
        return self.rng.integers(self.num_actions, size=len(obs))
