"""The registry: names to the modules that declare them, imported when asked for, and a light
``import shoal``."""

from __future__ import annotations

import importlib
import json
import pkgutil
import subprocess
import sys

import pytest

import shoal.algos
from shoal.algos.spec import AlgorithmSpec
from shoal.core.errors import ShoalError
from shoal.registry import ALGORITHMS, MODULES, Registry, algorithm_for_config, get_algorithm


def _algos_modules() -> list[str]:
    return [
        info.name
        for info in pkgutil.walk_packages(shoal.algos.__path__, "shoal.algos.")
        if not info.ispkg
    ]


def test_every_module_declares_the_names_the_registry_lists_there():
    """Adding an algorithm is its module with ``SPECS`` and a line in ``MODULES``: a module
    that declares a name the registry does not list (or the reverse) fails here."""
    declared: dict[str, str] = {}
    for name in _algos_modules():
        for spec in getattr(importlib.import_module(name), "SPECS", ()):
            assert isinstance(spec, AlgorithmSpec)
            assert spec.name not in declared, f"{spec.name} declared twice"
            declared[spec.name] = name
    assert declared == MODULES


def test_names_sharing_a_config_class_live_in_one_module():
    """`algorithm_for_config` looks among the imported modules first: a config class's
    names must all be there when one is."""
    homes: dict[type, set[str]] = {}
    for name, spec in ALGORITHMS.items():
        homes.setdefault(spec.config_cls, set()).add(MODULES[name])
    assert {cls.__name__: mods for cls, mods in homes.items() if len(mods) > 1} == {}


def _fresh_python(code: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    return json.loads(out.splitlines()[-1])


LOADED = (
    "import json, sys; "
    "mods = [m for m in sys.modules if m.startswith('shoal')]; "
    "print(json.dumps({'algos': sorted(m for m in mods if m.startswith('shoal.algos.')), "
    "'count': len(mods), 'torch': 'torch' in sys.modules}))"
)


def test_import_shoal_imports_no_algorithm_and_no_torch():
    loaded = _fresh_python("import shoal; " + LOADED)
    assert loaded == {"algos": [], "count": 1, "torch": False}  # shoal itself


def test_one_algorithm_is_imported_without_the_others():
    loaded = _fresh_python("import shoal; shoal.ALGORITHMS['sac']; " + LOADED)
    assert "shoal.algos.continuous.sac" in loaded["algos"]
    for other in ("muzero", "alphazero", "qmix", "ppo", "impala", "es", "dqn"):
        assert not any(m.endswith(f".{other}") for m in loaded["algos"]), other


def test_the_package_functions_are_the_api_functions():
    """``shoal.train``, ``shoal.collect`` and ``shoal.experiment`` are the functions even
    where the subpackage or module of the same name was imported first."""
    code = (
        "import shoal.train.callbacks, shoal.collect.record, shoal.studies.experiment, json; "
        "import shoal, shoal.api, shoal.studies.datasets; "
        "print(json.dumps([shoal.train is shoal.api.train, shoal.evaluate is shoal.api.evaluate, "
        "shoal.collect is shoal.studies.datasets.collect, callable(shoal.experiment), "
        "'train' in dir(shoal)]))"
    )
    assert _fresh_python(code) == [True] * 5
    with pytest.raises(AttributeError, match="no attribute 'no_such_thing'"):
        shoal.no_such_thing  # noqa: B018
    with pytest.raises(AttributeError, match="shoal.train is a function of the API"):
        shoal.train = print


def test_a_submodule_is_imported_when_first_read():
    """``shoal.registry`` and ``shoal.config`` after a bare ``import shoal``, as when that
    imported them all."""
    code = (
        "import shoal, json; "
        "print(json.dumps([shoal.registry.get_algorithm('dqn').name, "
        "callable(shoal.config.replace), 'shoal.registry' in __import__('sys').modules]))"
    )
    assert _fresh_python(code) == ["dqn", True, True]


def test_a_config_finds_its_name_among_the_imported_and_then_all():
    """TD3+BC's config extends TD3's: it is matched by class, not by isinstance."""
    from shoal.algos.offline.td3_bc import TD3BCConfig
    from shoal.algos.value.tabular import TabularConfig

    assert algorithm_for_config(TD3BCConfig()).name == "td3-bc"
    assert algorithm_for_config(TabularConfig(method="sarsa")).name == "sarsa"
    assert algorithm_for_config(get_algorithm("mappo").default_config()).name == "mappo"
    assert algorithm_for_config(get_algorithm("ppo").default_config()).name == "ppo"
    with pytest.raises(ShoalError, match="not the config of a registered algorithm"):
        algorithm_for_config(object())


def test_a_registry_line_that_disagrees_with_its_module_is_named():
    registry = Registry({"sac": "shoal.algos.continuous.sac", "td3": "shoal.algos.continuous.sac"})
    with pytest.raises(ShoalError, match=r"declares \['sac'\] but the registry lists"):
        registry["sac"]
    assert "td3" in registry and len(registry) == 2 and list(registry) == ["sac", "td3"]
    with pytest.raises(KeyError):
        registry["ppo"]


@pytest.mark.extra("offline")
def test_declared_capabilities_and_not_names_decide_the_evaluation(tmp_path):
    """An offline learner's normalized score is logged because its spec declares
    ``extra_evaluation``: renamed, it still is; with the declaration taken away, it is not."""
    import dataclasses

    from shoal.train.callbacks import Callback
    from shoal.train.loop import run

    class Evaluations(Callback):
        def __init__(self) -> None:
            self.names: set[str] = set()

        def on_evaluation(self, result: dict[str, float]) -> None:
            self.names |= set(result)

    data = shoal.collect(
        tmp_path / "data", env="Pendulum-v1", episodes=2, num_envs=2, ref_episodes=2,
        ref_max_score=-150.0,
    )  # fmt: skip
    bc = get_algorithm("bc")
    logged = {}
    for label, spec in (
        ("renamed", dataclasses.replace(bc, name="my-cloner")),
        ("undeclared", dataclasses.replace(bc, extra_evaluation=False)),
    ):
        config = bc.default_config(**{
            "dataset": str(data), "run.total_steps": 4, "run.eval_every_steps": 4,
            "run.eval_episodes": 1, "run.console": False, "run.tensorboard": False,
            "run.run_dir": str(tmp_path / label), "replay.batch_size": 8,
        })  # fmt: skip
        evaluations = Evaluations()
        run(spec, config, callbacks=[evaluations])
        assert "eval/return" in evaluations.names
        logged[label] = "eval/normalized_score" in evaluations.names
    assert logged == {"renamed": True, "undeclared": False}
