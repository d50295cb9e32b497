"""shoal: reinforcement learning on PyTorch, single and multi-agent, laptop to Ray cluster."""

from shoal.api import build_config, evaluate, load, make_env, train
from shoal.datasets import collect
from shoal.experiment import experiment
from shoal.registry import ALGORITHMS
from shoal.studies.export import export
from shoal.studies.report import report
from shoal.studies.tune import tune

__version__ = "0.1.0"
"""The version, written here only (pyproject.toml reads it; ``shoal --version`` prints it)."""

__all__ = [
    "ALGORITHMS",
    "build_config",
    "collect",
    "evaluate",
    "experiment",
    "export",
    "load",
    "make_env",
    "report",
    "train",
    "tune",
]
