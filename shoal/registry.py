"""Names to algorithms and tuned examples.

Each algorithm module declares its names' specs (``SPECS``, `shoal.algos.spec.AlgorithmSpec`);
the registry knows which module holds each name (`MODULES`) and imports a module when one of
its names is first asked for, so ``import shoal`` and a run of one algorithm do not load the
other 40. Adding an algorithm: its module with ``SPECS``, and its line in `MODULES`
(`tests/test_registry.py` checks the two agree).
"""

from __future__ import annotations

import difflib
import importlib
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from shoal.algos.spec import NUMPY_BACKENDS, AlgorithmSpec
from shoal.config import from_dict, read_yaml
from shoal.core.errors import ConfigError, ShoalError

__all__ = [
    "ALGORITHMS",
    "MODULES",
    "NUMPY_BACKENDS",
    "AlgorithmSpec",
    "TunedExample",
    "algorithm_for_config",
    "find_tuned",
    "get_algorithm",
    "read_tuned",
    "tuned_dir",
    "tuned_examples",
]

_ALGOS = "shoal.algos"
MODULES: dict[str, str] = {
    # policy gradient
    "ppo": f"{_ALGOS}.multi_agent.multi_policy",  # PPO, or several policies on a team
    "mappo": f"{_ALGOS}.multi_agent.multi_policy",
    "ippo": f"{_ALGOS}.multi_agent.multi_policy",
    "pg": f"{_ALGOS}.policy_gradient.pg",
    "a2c": f"{_ALGOS}.policy_gradient.a2c",
    "acer": f"{_ALGOS}.policy_gradient.acer",
    "acktr": f"{_ALGOS}.policy_gradient.acktr",
    "trpo": f"{_ALGOS}.policy_gradient.trpo",
    "impala": f"{_ALGOS}.policy_gradient.impala",
    "a3c": f"{_ALGOS}.policy_gradient.a3c",
    "ddppo": f"{_ALGOS}.policy_gradient.ddppo",
    "appo": f"{_ALGOS}.policy_gradient.appo",
    # teams of agents
    "maddpg": f"{_ALGOS}.multi_agent.maddpg",
    "ctedd": f"{_ALGOS}.multi_agent.ctedd",
    "qmix": f"{_ALGOS}.multi_agent.qmix",
    "vdn": f"{_ALGOS}.multi_agent.qmix",
    "iql": f"{_ALGOS}.multi_agent.qmix",
    "maddpg-distributed": f"{_ALGOS}.multi_agent.distributed_maddpg",
    # value-based
    "dqn": f"{_ALGOS}.value.dqn",
    "qrdqn": f"{_ALGOS}.value.dqn",
    "rem": f"{_ALGOS}.value.dqn",
    "r2d2": f"{_ALGOS}.value.r2d2",
    "apex-dqn": f"{_ALGOS}.value.apex",
    "apex-ddpg": f"{_ALGOS}.value.apex",
    "apex-r2d2": f"{_ALGOS}.value.apex",
    "q-learning": f"{_ALGOS}.value.tabular",
    "sarsa": f"{_ALGOS}.value.tabular",
    "expected-sarsa": f"{_ALGOS}.value.tabular",
    "sarsa-lambda": f"{_ALGOS}.value.tabular",
    "q-lambda": f"{_ALGOS}.value.tabular",
    "tabular": f"{_ALGOS}.value.tabular",
    # continuous control
    "ddpg": f"{_ALGOS}.continuous.ddpg",
    "td3": f"{_ALGOS}.continuous.td3",
    "sac": f"{_ALGOS}.continuous.sac",
    "d4pg": f"{_ALGOS}.continuous.d4pg",
    # offline
    "bc": f"{_ALGOS}.offline.bc",
    "cql": f"{_ALGOS}.offline.cql",
    "iql-offline": f"{_ALGOS}.offline.iql",
    "td3-bc": f"{_ALGOS}.offline.td3_bc",
    # evolution
    "es": f"{_ALGOS}.evolution.es",
    "ars": f"{_ALGOS}.evolution.ars",
    "ga": f"{_ALGOS}.evolution.ga",
    "cmaes": f"{_ALGOS}.evolution.cmaes",
    # search and planning
    "alphazero": f"{_ALGOS}.planning.alphazero",
    "muzero": f"{_ALGOS}.planning.muzero",
    "mcts": f"{_ALGOS}.planning.planner",
}
"""Every registered name -> the module whose ``SPECS`` declares it."""


class Registry(Mapping[str, AlgorithmSpec]):
    """The registered algorithms as a read-only mapping of name -> spec that imports an
    algorithm's module when its spec is first looked up. Its names (``iter``, ``in``,
    ``len``) cost no import; ``values()`` and ``items()`` import every module."""

    def __init__(self, modules: Mapping[str, str]) -> None:
        self._modules = dict(modules)
        self._specs: dict[str, AlgorithmSpec] = {}

    def __getitem__(self, name: str) -> AlgorithmSpec:
        spec = self._specs.get(name)
        if spec is None:
            self._load(self._modules[name])  # KeyError for an unknown name
            spec = self._specs[name]
        return spec

    def __iter__(self) -> Iterator[str]:
        return iter(self._modules)

    def __len__(self) -> int:
        return len(self._modules)

    def __contains__(self, name: object) -> bool:
        return name in self._modules

    def loaded(self) -> list[AlgorithmSpec]:
        """The specs of the modules imported so far (by the registry or by anyone)."""
        for module in set(self._modules.values()):
            if module in sys.modules:
                self._load(module)
        return [self._specs[name] for name in self._modules if name in self._specs]

    def _load(self, module_name: str) -> None:
        declared = {spec.name: spec for spec in importlib.import_module(module_name).SPECS}
        listed = {name for name, module in self._modules.items() if module == module_name}
        if set(declared) != listed:
            raise ShoalError(
                f"{module_name} declares {sorted(declared)} but the registry lists "
                f"{sorted(listed)} there (shoal.registry.MODULES)"
            )
        self._specs.update(declared)


ALGORITHMS = Registry(MODULES)
"""Name -> `AlgorithmSpec` of every registered algorithm, imported on first lookup."""


def get_algorithm(name: str) -> AlgorithmSpec:
    if not isinstance(name, str):
        raise ConfigError(f"algo must name an algorithm (e.g. ppo), not {name!r}")
    key = name.lower()
    if key not in ALGORITHMS:
        close = difflib.get_close_matches(key, list(ALGORITHMS), n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise ShoalError(f"unknown algorithm {name!r}.{hint} Known: {', '.join(ALGORITHMS)}")
    return ALGORITHMS[key]


def algorithm_for_config(config: Any) -> AlgorithmSpec:
    """The spec of ``config``'s class whose ``defaults`` it matches, the most specific one
    where several do (a `TabularConfig` with method sarsa is ``sarsa``, not ``tabular``)."""
    # The module that defines the config's class is imported; its specs are among those
    # loaded, unless they live in another module (PPO's, beside its multi-agent form).
    for specs in (ALGORITHMS.loaded, lambda: list(ALGORITHMS.values())):
        matches = [spec for spec in specs() if spec.matches(config)]
        if matches:
            return max(matches, key=lambda spec: len(spec.defaults))
    raise ShoalError(f"{type(config).__name__} is not the config of a registered algorithm")


@dataclass(frozen=True)
class TunedExample:
    name: str
    algo: str
    description: str
    expected: str
    config: dict[str, Any]
    """Overrides of the algorithm's default config, as in the YAML file."""

    def build_config(self) -> Any:
        spec = get_algorithm(self.algo)
        return from_dict(spec.config_cls, self.config, path=self.name, base=spec.default_config())


def tuned_dir() -> Path:
    return Path(str(resources.files("shoal") / "tuned"))


def tuned_examples() -> dict[str, TunedExample]:
    return {p.stem: read_tuned(p) for p in sorted(tuned_dir().glob("*.yaml"))}


def read_tuned(path: str | Path) -> TunedExample:
    """A tuned example from a YAML file with keys algo, description, expected, config."""
    path = Path(path)
    data = read_yaml(path)
    if not isinstance(data, dict) or "algo" not in data:
        raise ConfigError(f"{path} must be a mapping with at least an 'algo' key")
    unknown = set(data) - {"algo", "description", "expected", "config", "callbacks"}
    if unknown:
        raise ConfigError(f"{path}: unknown top-level keys {sorted(unknown)}")
    get_algorithm(data["algo"])
    config = data.get("config") or {}
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: config must be a mapping of fields, got {config!r}")
    config = dict(config)
    if "callbacks" in data:  # a top-level shorthand for run.callbacks
        callbacks = data["callbacks"]
        if isinstance(callbacks, str) or not isinstance(callbacks, list):
            raise ConfigError(f"{path}: callbacks must be a list of names, got {callbacks!r}")
        config["run"] = {**dict(config.get("run") or {}), "callbacks": list(callbacks)}
    return TunedExample(
        name=path.stem,
        algo=data["algo"],
        description=str(data.get("description", "")),
        expected=str(data.get("expected", "")),
        config=config,
    )


def find_tuned(name_or_path: str) -> TunedExample:
    """A tuned example by name (``ppo-cartpole``) or by YAML path."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml"):
        if not path.exists():
            raise ConfigError(f"config file {path} does not exist")
        return read_tuned(path)
    file = tuned_dir() / f"{name_or_path}.yaml"  # one file read, not every example's
    if "/" in name_or_path or not file.is_file():
        names = sorted(p.stem for p in tuned_dir().glob("*.yaml"))
        close = difflib.get_close_matches(name_or_path, names, n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise ConfigError(f"unknown tuned example {name_or_path!r}.{hint}")
    return read_tuned(file)
