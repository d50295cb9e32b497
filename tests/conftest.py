"""Shared fixtures: tiny PPO settings that keep end-to-end runs well under a second."""

import importlib.util
import os
import tempfile
from pathlib import Path

import gymnasium as gym
import pytest

# 4 envs x 16 steps = 64 env steps per iteration, two epochs of two minibatches, a tiny network.
ITERATION_STEPS = 64


def _small_ppo(**extra):
    overrides = {
        "env.num_envs": 4,
        "num_steps": 16,
        "minibatch_size": 32,
        "num_epochs": 2,
        "model.hidden": (16,),
        "run.eval_every_steps": 0,
        "run.checkpoint_every_steps": 0,
        "run.console": False,
        "run.tensorboard": False,
    }
    overrides.update(extra)
    return overrides


@pytest.fixture
def small_ppo():
    """``small_ppo(**extra)``: override dict for `shoal.train` giving a fast, quiet PPO run
    of `ITERATION_STEPS` env steps per iteration."""
    return _small_ppo


@pytest.fixture
def iteration_steps():
    return ITERATION_STEPS


@pytest.fixture
def registered_env():
    """``registered_env(env_id, cls)`` registers a test env with Gymnasium for one test."""
    ids = []

    def register(env_id, cls):
        gym.register(env_id, entry_point=cls)
        ids.append(env_id)
        return env_id

    yield register
    for env_id in ids:
        gym.registry.pop(env_id, None)


EXTRAS = {
    "pettingzoo": ("pettingzoo", "mpe2", "pygame"),
    "tune": ("optuna",),
    "report": ("matplotlib",),
    "ray": ("ray",),
    "cma": ("cma",),
    "offline": ("minari", "h5py"),
    "openspiel": ("pyspiel",),
    "box2d": ("Box2D",),
    "atari": ("ale_py", "cv2"),
    "mujoco": ("mujoco",),
    "sumo": ("libsumo",),
    "smarts": ("smarts",),
    "export": ("onnx", "onnxruntime", "onnxscript"),
    "wandb": ("wandb",),
    "mlflow": ("mlflow",),
    "video": ("imageio_ffmpeg", "pygame"),
    "docs": ("mkdocs", "material", "mkdocstrings", "griffe"),
}
"""shoal's optional extras and the modules each brings (pyproject.toml)."""


def missing_extras(names) -> list[str]:
    """The extras among ``names`` whose modules are not all importable here."""
    return [n for n in names if any(importlib.util.find_spec(m) is None for m in EXTRAS[n])]


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (``make test`` runs one worker per core) the tests of
    ``tests/distributed`` (and any other user of the local Ray) run in the same worker, so the
    session starts one Ray, not one per worker; those on Ray's stand-ins (``in_process_ray``,
    ``forked_learners``) run in any worker. The traffic simulators' tests that start
    processes of their own (SUMO, SMARTS) join that group, so they never load the cores under
    a timing-dependent Ray learning test.

    A test marked ``extra(name, ...)`` needs those optional extras: where one is missing it
    is skipped, saying what to install (``make test`` installs every extra)."""
    distributed = Path(__file__).parent / "distributed"
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        uses_ray = "ray_session" in fixtures
        stand_in = "in_process_ray" in fixtures or "forked_learners" in fixtures
        if uses_ray or (distributed in item.path.parents and not stand_in):
            item.add_marker(pytest.mark.xdist_group("ray"))
        names = [n for mark in item.iter_markers("extra") for n in mark.args]
        missing = missing_extras(names)
        if missing:
            extras = ",".join(missing)
            item.add_marker(pytest.mark.skip(reason=f"needs pip install 'shoal[{extras}]'"))


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray (2 CPUs) shared by every test that needs it; shut down at the end.
    Skips only where the ray extra is not installed (CI installs it)."""
    pytest.importorskip("ray", reason="needs pip install 'shoal[ray]'")
    from shoal.distributed import require_ray

    # Ray workers inherit this environment: let them import test helpers (e.g. flaky_env).
    tests_dir = str(Path(__file__).parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [tests_dir, os.environ.get("PYTHONPATH")])
    )

    workers = require_ray()
    # Its workers fork from a process that imported torch and shoal once
    # (tests/ray_zygote.py): about 3 s less CPU per actor started.
    from ray_zygote import use_zygote

    with tempfile.TemporaryDirectory(prefix="shoal-zygote-") as directory:
        with use_zygote(directory):
            workers.connect(None, num_cpus=2)
        yield workers
        workers.shutdown()


@pytest.fixture
def forked_learners(monkeypatch):
    """Learner groups' and DD-PPO's ranks forked from the test process, called as Ray calls
    them (``tests/forked_ray.py``): their collectives and restarts without an actor's
    start-up."""
    from forked_ray import use_forked_learners

    use_forked_learners(monkeypatch)


@pytest.fixture
def in_process_ray(monkeypatch):
    """Ray's worker API in this process for the whole test (``tests/in_process_ray.py``): a
    distributed algorithm's logic, bit for bit what it does on Ray with its results taken in
    turn, without an actor's start-up."""
    from in_process_ray import use_in_process_ray

    use_in_process_ray(monkeypatch)


def pytest_addoption(parser):
    parser.addoption(
        "--seed-offset",
        type=int,
        default=0,
        help="learning tests: train with each fresh run's seed shifted by N, to measure a "
        "learning test's spread over seeds (make test-learning-seeds)",
    )


@pytest.fixture(autouse=True)
def _shifted_seeds(request, monkeypatch):
    """``--seed-offset N``: every fresh run a learning test trains (through `shoal.train`)
    takes its seed plus N, so ``pytest -m learning --seed-offset 1..4`` measures whether each
    threshold holds across seeds, not only on the seed it was set on. Resumed runs keep their
    checkpoint's seed."""
    offset = request.config.getoption("--seed-offset")
    if not offset or request.node.get_closest_marker("learning") is None:
        yield
        return
    import shoal.api
    from shoal.config import replace

    run = shoal.api.run

    def shifted(spec, config, resume=None, **kwargs):
        if resume is None:
            config = replace(config, **{"run.seed": config.run.seed + offset})
        return run(spec, config, resume=resume, **kwargs)

    monkeypatch.setattr(shoal.api, "run", shifted)
    yield
