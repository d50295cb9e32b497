"""Vector environments: the protocol, the Gymnasium adapter and wrappers."""

from shoal.envs.base import VectorEnv, VectorEnvWrapper
from shoal.envs.goal_line import register as _register_goal_line
from shoal.envs.gym import GymVectorEnv
from shoal.envs.ids import env_spec
from shoal.envs.intersection import IntersectionEnv as _IntersectionEnv  # noqa: F401 (registers both ids)
from shoal.envs.make import make_env
from shoal.envs.matrix_games import TWO_STEP_ID as _TWO_STEP_ID  # noqa: F401 (registers it)
from shoal.envs.memory import register as _register_memory
from shoal.envs.normalize import NormalizeObservation, NormalizeReward, RunningMeanStd
from shoal.envs.particles import ParticleEnv

_register_memory()
_register_goal_line()

__all__ = [
    "GymVectorEnv",
    "NormalizeObservation",
    "NormalizeReward",
    "ParticleEnv",
    "RunningMeanStd",
    "VectorEnv",
    "VectorEnvWrapper",
    "env_spec",
    "make_env",
]
