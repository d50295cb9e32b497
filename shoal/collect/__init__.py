"""Samplers: step environments with a copy of the policy and return time-major batches."""

from shoal.collect.env_runner import EnvRunner
from shoal.collect.local import LocalSampler

__all__ = ["EnvRunner", "LocalSampler"]
