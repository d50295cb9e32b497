"""CartPole that raises once in ``step``: the exception-in-an-env case of the Ray tests.

Gymnasium imports this module from the id ``flaky_env:FlakyCartPole-v0`` in whichever process
builds the env (a Ray actor included) and the import registers the id. The env raises on its
``fail_at_step``-th step when the file ``fail_flag`` exists, deleting the file first, so
exactly one env in one process fails, once.
"""

import os

import gymnasium as gym
from gymnasium.envs.classic_control import CartPoleEnv


class FlakyCartPole(CartPoleEnv):
    def __init__(self, fail_flag: str | None = None, fail_at_step: int = 5, **kwargs):
        super().__init__(**kwargs)
        self.fail_flag = fail_flag
        self.fail_at_step = fail_at_step
        self.steps = 0

    def step(self, action):
        self.steps += 1
        flag = self.fail_flag
        if self.steps == self.fail_at_step and flag and os.path.exists(flag):
            try:
                os.remove(flag)
            except FileNotFoundError:  # another env of the batch took it first
                return super().step(action)
            raise RuntimeError("injected env failure")
        return super().step(action)


if "FlakyCartPole-v0" not in gym.envs.registry:
    gym.register("FlakyCartPole-v0", entry_point=FlakyCartPole, max_episode_steps=500)
