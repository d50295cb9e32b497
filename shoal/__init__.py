"""shoal: reinforcement learning on PyTorch, single and multi-agent, laptop to Ray cluster.

The functions below are imported when first used, so ``import shoal`` (and every ``shoal``
command, test subprocess and Ray actor that starts with it) loads no algorithm, no network
and no env until one is asked for.
"""

from __future__ import annotations

import importlib
import importlib.abc
import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shoal.api import build_config, evaluate, load, make_env, train
    from shoal.registry import ALGORITHMS
    from shoal.studies.datasets import collect
    from shoal.studies.experiment import experiment
    from shoal.studies.export import export
    from shoal.studies.report import report
    from shoal.studies.tune import tune

__version__ = "0.1.0"
"""The version, written here only (pyproject.toml reads it; ``shoal --version`` prints it)."""

_HOMES = {
    "ALGORITHMS": "shoal.registry",
    "build_config": "shoal.api",
    "collect": "shoal.studies.datasets",
    "evaluate": "shoal.api",
    "experiment": "shoal.studies.experiment",
    "export": "shoal.studies.export",
    "load": "shoal.api",
    "make_env": "shoal.api",
    "report": "shoal.studies.report",
    "train": "shoal.api",
    "tune": "shoal.studies.tune",
}
"""Each public name -> the module that defines it."""

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
assert sorted(__all__) == sorted(_HOMES)


class _PublicName:
    """A name of the Python API, imported from its module when first read. It is a data
    descriptor so that a subpackage or module of the same name (``shoal.train``,
    ``shoal.collect``) does not shadow it: the import system binds a
    subpackage on its parent when it is first imported, and that binding is dropped here
    (imports find the subpackage in ``sys.modules``). So ``from shoal.train import
    checkpoint`` imports the module, while ``import shoal.train.checkpoint as c`` does not
    (it looks the module up as an attribute of ``shoal.train``, the function)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, module: object, owner: type | None = None) -> Any:
        return getattr(importlib.import_module(_HOMES[self.name]), self.name)

    def __set__(self, module: object, value: Any) -> None:
        if not isinstance(value, ModuleType):
            raise AttributeError(f"shoal.{self.name} is a function of the API: it cannot be set")


class _Shoal(ModuleType):
    ALGORITHMS = _PublicName()
    build_config = _PublicName()
    collect = _PublicName()
    evaluate = _PublicName()
    experiment = _PublicName()
    export = _PublicName()
    load = _PublicName()
    make_env = _PublicName()
    report = _PublicName()
    train = _PublicName()
    tune = _PublicName()

    def __getattr__(self, name: str) -> Any:
        """A subpackage or module not imported yet (``shoal.registry``, ``shoal.config``):
        imported now, as ``import shoal`` used to import them all."""
        if name.startswith("__"):
            raise AttributeError(f"module 'shoal' has no attribute {name!r}")
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module 'shoal' has no attribute {name!r}") from None

    def __dir__(self) -> list[str]:
        return sorted(set(self.__dict__) | set(_HOMES))


sys.modules[__name__].__class__ = _Shoal

MOVED = {
    **{
        f"{__name__}.{old}": f"{__name__}.{new}"
        for old, new in {
            "types": "core.types",
            "errors": "core.errors",
            "interfaces": "core.interfaces",
            "device": "core.device",
            "seeding": "core.seeding",
            "threads": "core.threads",
            "imports": "core.imports",
            "stats": "core.stats",
            "schedules": "optim.schedules",
            "kfac": "optim.kfac",
            "policy": "nn.policy",
            "backend": "fast.backend",
            "evaluation": "studies.evaluation",
            "experiment": "studies.experiment",
            "experiment_plan": "studies.plan",
            "datasets": "studies.datasets",
        }.items()
    },
    **{
        f"{__name__}.algos.{old}": f"{__name__}.algos.{family}.{old}"
        for family, members in {
            "cores": ("on_policy", "off_policy", "actor_critic_replay"),
            "value": ("tabular", "dqn", "apex", "apex_actor"),
            "policy_gradient": ("pg", "a2c", "a3c", "ppo", "appo", "trpo", "impala", "ddppo"),
            "continuous": ("ddpg", "td3", "sac", "d4pg"),
            "multi_agent": ("multi_policy", "maddpg", "distributed_maddpg", "qmix", "ctedd"),
        }.items()
        for old in members
    },
}
"""A module's earlier path -> where it lives now: the top-level modules grouped into the
floors' folders in the fourth wave (``shoal.errors`` is ``shoal.core.errors``), and shoal
0.1's flat algorithm paths (``shoal.algos.ppo``)."""


class _MovedModules(importlib.abc.MetaPathFinder):
    """An import of a module by an earlier path fails naming where the module lives now,
    rather than with Python's bare "No module named"."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> None:
        if fullname in MOVED:
            raise ModuleNotFoundError(
                f"{fullname} is now {MOVED[fullname]} (shoal's modules moved into the floors' "
                "folders; see docs/changelog.md)",
                name=fullname,
            )


if not any(type(finder).__name__ == "_MovedModules" for finder in sys.meta_path):
    sys.meta_path.append(_MovedModules())
