"""A one-step contextual bandit for the composite action spaces: the observation is a one-hot
cue ``c`` of 3, and the reward counts the parts of the action that match ``c``.

``kind``:
* ``multidiscrete``: MultiDiscrete([3, 4]); pays ``[a0 == c] + [a1 == c + 1]`` (max 2).
* ``multibinary``: MultiBinary(3); pays the bits equal to ``one_hot(c)`` (max 3).
* ``tuple``: Tuple(Discrete(3), Box(-2, 2, (1,))); pays ``[a0 == c] - |a1 - (c - 1)|`` (max 1).
* ``dict``: Dict(pick=Discrete(3, start=1), flags=MultiBinary(2)); pays ``[pick == c + 1]``
  plus the flags equal to ``[c == 0, c == 1]`` (max 3).

Importing the module registers ``Actions-v0``: ``tests.action_env:Actions-v0``."""

import gymnasium as gym
import numpy as np

SPACES = {
    "multidiscrete": gym.spaces.MultiDiscrete([3, 4]),
    "multibinary": gym.spaces.MultiBinary(3),
    "tuple": gym.spaces.Tuple((gym.spaces.Discrete(3), gym.spaces.Box(-2.0, 2.0, (1,)))),
    "dict": gym.spaces.Dict(
        {"pick": gym.spaces.Discrete(3, start=1), "flags": gym.spaces.MultiBinary(2)}
    ),
}
BEST = {"multidiscrete": 2.0, "multibinary": 3.0, "tuple": 1.0, "dict": 3.0}


class ActionsEnv(gym.Env):
    observation_space = gym.spaces.Box(0.0, 1.0, (3,), np.float32)

    def __init__(self, kind="multidiscrete"):
        self.kind = kind
        self.action_space = SPACES[kind]
        self.cue = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.cue = int(self.np_random.integers(3))
        return np.eye(3, dtype=np.float32)[self.cue], {}

    def step(self, action):
        assert self.action_space.contains(self._typed(action)), (self.kind, action)
        c = self.cue
        if self.kind == "multidiscrete":
            reward = float(action[0] == c) + float(action[1] == c + 1)
        elif self.kind == "multibinary":
            reward = float((np.asarray(action) == np.eye(3)[c]).sum())
        elif self.kind == "tuple":
            reward = float(action[0] == c) - abs(float(action[1][0]) - (c - 1))
        else:
            target = np.array([c == 0, c == 1])
            reward = float(action["pick"] == c + 1) + float((action["flags"] == target).sum())
        return np.eye(3, dtype=np.float32)[c], reward, True, False, {}

    def _typed(self, action):
        if self.kind == "multibinary":
            return np.asarray(action, np.int8)
        if self.kind == "tuple":
            return (int(action[0]), np.asarray(action[1], np.float32))
        if self.kind == "dict":
            return {"pick": int(action["pick"]), "flags": np.asarray(action["flags"], np.int8)}
        return np.asarray(action, np.int64)


if "Actions-v0" not in gym.registry:
    gym.register("Actions-v0", entry_point=ActionsEnv)
