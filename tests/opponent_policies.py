"""A scripted opponent for the tests of ``env.opponents`` (`shoal.envs.opponents`)."""

import numpy as np


class Constant:
    """Every agent of the group takes action ``value``; counts its calls."""

    calls = 0

    def __init__(self, observation_space, action_space, value=0):
        self.value = value

    def act(self, obs, action_mask):
        Constant.calls += 1
        return np.full(obs.shape[:2], self.value)
