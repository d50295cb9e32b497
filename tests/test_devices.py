"""Devices (``run.device``): every learner trains through the device code path on the CPU,
unavailable devices and precisions are refused before anything is built, and checkpoints
move between devices. The ``gpu`` tests repeat the smoke and exact-resume tests on CUDA where
a GPU is present (`make test` skips them elsewhere, saying why)."""

import json

import numpy as np
import pytest
import torch
from image_env import FakeImageEnv
from state_helpers import assert_states_equal, metric_rows

import shoal
from shoal.algos.policy_gradient.ppo import PPOBatch
from shoal.config import RunConfig
from shoal.device import (
    autocast_dtype,
    check_precision,
    grad_scaler,
    resolve_device,
    to_device,
    to_host,
)
from shoal.errors import ConfigError
from shoal.train.checkpoint import load_checkpoint

QUIET = {
    "run.eval_every_steps": 0,
    "run.checkpoint_every_steps": 0,
    "run.console": False,
    "run.tensorboard": False,
}

REPLAY = {
    "replay.batch_size": 8,
    "replay.learning_starts": 8,
    "replay.buffer_size": 200,
    "replay.gradient_steps": 2,
}

# Every algorithm that learns in one process, with settings for two quick iterations.
SMALL = {
    "ppo": {"env.num_envs": 4, "num_steps": 8, "minibatch_size": 16, "num_epochs": 2},
    "ppo-lstm": {
        "env.num_envs": 4,
        "num_steps": 8,
        "minibatch_size": 16,
        "num_epochs": 1,
        "model.lstm_hidden": 8,
    },
    "mappo": {"env.id": "shoal/spread-v0", "env.num_envs": 2, "num_steps": 8, "minibatch_size": 16},
    "a2c": {"env.num_envs": 4, "num_steps": 8},
    "pg": {"env.num_envs": 4, "num_steps": 32},
    "trpo": {"env.num_envs": 4, "num_steps": 8, "vf_minibatch_size": 16},
    "dqn": {"env.num_envs": 2, "rollout_steps": 4, **REPLAY},
    "rainbow": {
        "env.num_envs": 2,
        "rollout_steps": 4,
        "value_head": "c51",
        "noisy": True,
        "dueling": True,
        "replay.prioritized": "proportional",
        "replay.n_step": 3,
        **REPLAY,
    },
    "qrdqn": {"env.num_envs": 2, "rollout_steps": 4, **REPLAY},
    "rem": {"env.num_envs": 2, "rollout_steps": 4, **REPLAY},
    "sac": {"env.id": "Pendulum-v1", "env.num_envs": 2, "rollout_steps": 4, **REPLAY},
    "td3": {"env.id": "Pendulum-v1", "env.num_envs": 2, "rollout_steps": 4, **REPLAY},
    "ddpg": {"env.id": "Pendulum-v1", "env.num_envs": 2, "rollout_steps": 4, **REPLAY},
    "d4pg": {
        "env.id": "Pendulum-v1",
        "env.num_envs": 2,
        "rollout_steps": 4,
        "num_atoms": 11,
        **REPLAY,
    },
    "maddpg": {"env.num_envs": 2, "rollout_steps": 4, **REPLAY},
    "ctedd": {"env.num_envs": 2, "rollout_steps": 4, "distill_every": 16, **REPLAY},
    "qmix": {
        "env.num_envs": 4,
        "rollout_steps": 4,
        "replay.batch_size": 4,
        "replay.learning_starts": 4,
    },
    "a3c": {"run.runners": 0, "env.num_envs": 4, "a2c.num_steps": 8},
    "impala": {"env.num_envs": 4, "num_steps": 8},
}
ALIASES = {"ppo-lstm": "ppo", "rainbow": "dqn"}


def learner_networks(algo) -> torch.nn.Module:
    learner = algo.learner
    for name in ("model", "online"):
        if hasattr(learner, name):
            return getattr(learner, name)
    return learner.core.critic


def train_small(name: str, device: str, run_dir, **extra):
    algo = ALIASES.get(name, name)
    overrides = {**QUIET, **SMALL[name], "run.device": device, **extra}
    return shoal.train(algo, seed=1, total_steps=32, run_dir=str(run_dir), **overrides)


def smoke(name: str, device: str, tmp_path) -> None:
    """Train, checkpoint, load: the learner's networks were on ``device``, the deployed
    policy acts on the CPU."""
    seen = []

    def record(steps, metrics):
        seen.append(metrics)

    result = train_small(name, device, tmp_path / name, on_iteration=record)
    assert result.env_steps >= 32 and seen
    state = load_checkpoint(result.run_dir).state["algorithm"]
    for tensor in _tensors(state):
        assert tensor.device.type == "cpu"  # checkpoints load onto the CPU
    policy = shoal.load(result.run_dir)
    assert all(p.device.type == "cpu" for p in policy.model.parameters())


def _tensors(tree):
    if isinstance(tree, torch.Tensor):
        yield tree
    elif isinstance(tree, dict):
        for value in tree.values():
            yield from _tensors(value)
    elif isinstance(tree, (list, tuple)):
        for value in tree:
            yield from _tensors(value)


@pytest.mark.parametrize("name", list(SMALL))
def test_every_learner_trains_on_the_cpu_device(name, tmp_path):
    smoke(name, "cpu", tmp_path)


def test_learners_keep_their_networks_on_the_run_device():
    from shoal.registry import get_algorithm

    for name in ("ppo", "dqn", "sac", "maddpg", "qmix"):
        spec = get_algorithm(name)
        config = spec.default_config(**{**QUIET, **SMALL[name], "run.device": "cpu"})
        algo = spec.algorithm_cls(config)
        try:
            assert all(p.device.type == "cpu" for p in learner_networks(algo).parameters())
            assert algo.learner.device == torch.device("cpu")
        finally:
            algo.close()


def test_resolve_device_names_the_field_and_what_is_available():
    assert resolve_device("cpu") == torch.device("cpu")
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected
    with pytest.raises(ConfigError, match=r"run.device = 'cuda:7' is not available here"):
        resolve_device("cuda:7")
    with pytest.raises(ConfigError, match=r"available: cpu"):
        resolve_device("cuda:7")
    with pytest.raises(ConfigError, match="must be auto, cpu, cuda or cuda:N"):
        resolve_device("gpu")
    with pytest.raises(ConfigError, match="RunConfig.device"):
        RunConfig(device="tpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_an_unavailable_device_fails_before_anything_is_built(tmp_path):
    with pytest.raises(ConfigError, match="run.device = 'cuda' is not available"):
        shoal.train("ppo", run_dir=str(tmp_path / "r"), **QUIET, **{"run.device": "cuda"})
    assert not (tmp_path / "r").exists()


def test_float16_needs_cuda_and_backends_need_a_learner_that_has_them(tmp_path):
    with pytest.raises(ConfigError, match="model.precision = 'float16' needs a CUDA device"):
        check_precision("float16", torch.device("cpu"))
    overrides = {**QUIET, "model.encoder": "nature", "model.precision": "float16"}
    with pytest.raises(ConfigError, match="float16"):
        shoal.train("ppo", env="CartPole-v1", run_dir=str(tmp_path / "f"), **overrides)
    assert grad_scaler("bfloat16", torch.device("cpu")) is None
    assert autocast_dtype("float32") is None and autocast_dtype("float16") == torch.float16
    with pytest.raises(ConfigError, match="model.backend = 'numpy' is not available for dqn"):
        shoal.train("dqn", run_dir=str(tmp_path / "d"), **QUIET, **{"model.backend": "numpy"})
    with pytest.raises(ConfigError, match="tabular methods compute on the CPU"):
        shoal.build_config("q-learning", **{"run.device": "cuda"})


def test_to_device_moves_nested_batches_and_leaves_cpu_tensors_alone():
    batch = PPOBatch(*(torch.zeros(3) for _ in range(6)))
    moved = to_device({"a": [batch, np.zeros(2)], "b": None}, torch.device("cpu"))
    assert moved["a"][0].obs is batch.obs and isinstance(moved["a"][1], np.ndarray)
    weights = {"w": torch.ones(2, requires_grad=True)}
    host = to_host(weights)
    assert not host["w"].requires_grad and host["w"].data_ptr() == weights["w"].data_ptr()


def test_a_checkpoint_from_a_gpu_run_loads_and_resumes_on_the_cpu(tmp_path):
    """A run configured for CUDA (as written on a GPU machine) deploys on the CPU, and resumes
    here once told to use it; resuming with the device it names fails with what to do."""
    result = train_small("ppo", "cpu", tmp_path / "run")
    config_path = result.checkpoint / "config.json"
    config = json.loads(config_path.read_text())
    config["run"]["device"] = "cuda:0"
    config_path.write_text(json.dumps(config))
    policy = shoal.load(result.run_dir)
    assert policy.act(np.zeros((2, 4), np.float32)).shape == (2,)
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="run.device = 'cuda:0' is not available"):
            shoal.train(resume=result.run_dir, total_steps=64)
    resumed = shoal.train(resume=result.run_dir, total_steps=64, **{"run.device": "cpu"})
    assert resumed.env_steps == 64


# --- on a GPU ------------------------------------------------------------------------------------

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("name", list(SMALL))
def test_every_learner_trains_on_cuda(name, tmp_path):
    smoke(name, "cuda", tmp_path)


@pytest.mark.gpu
@needs_gpu
def test_learners_keep_their_networks_on_cuda():
    from shoal.registry import get_algorithm

    for name in ("ppo", "dqn", "sac", "maddpg", "qmix"):
        spec = get_algorithm(name)
        config = spec.default_config(**{**QUIET, **SMALL[name], "run.device": "cuda"})
        algo = spec.algorithm_cls(config)
        try:
            assert all(p.is_cuda for p in learner_networks(algo).parameters()), name
        finally:
            algo.close()


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("name", ["ppo", "a2c", "dqn", "sac", "maddpg"])
def test_exact_resume_on_cuda(name, tmp_path):
    """A resumed CUDA run repeats the straight one (same device, same seed)."""
    total = 64
    extra = {"run.checkpoint_every_steps": 16, "run.device": "cuda"}
    if "replay.batch_size" in SMALL[name]:
        extra["replay.save"] = True
    overrides = {**QUIET, **SMALL[name], **extra, "optim.anneal_steps": total}
    algo = name
    part = shoal.train(algo, seed=3, total_steps=32, run_dir=str(tmp_path / "a"), **overrides)
    resumed = shoal.train(resume=part.run_dir, total_steps=total)
    straight = shoal.train(
        algo, seed=3, total_steps=total, run_dir=str(tmp_path / "b"), **overrides
    )
    got = load_checkpoint(resumed.run_dir).state["algorithm"]
    want = load_checkpoint(straight.run_dir).state["algorithm"]
    assert_states_equal(got, want)
    assert metric_rows(resumed.run_dir) == metric_rows(straight.run_dir)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("precision", ["bfloat16", "float16"])
def test_mixed_precision_trains_an_image_encoder_on_cuda(precision, tmp_path, registered_env):
    env_id = registered_env("FakeImage-v0", FakeImageEnv)
    overrides = {
        **QUIET,
        "env.num_envs": 4,
        "num_steps": 8,
        "minibatch_size": 16,
        "num_epochs": 1,
        "model.encoder": "nature",
        "model.shared_trunk": True,
        "model.precision": precision,
        "run.device": "cuda",
    }
    result = shoal.train("ppo", env=env_id, total_steps=64, run_dir=str(tmp_path), **overrides)
    assert result.env_steps == 64
    policy = shoal.load(result.run_dir)
    assert all(p.dtype == torch.float32 for p in policy.model.parameters())


@pytest.mark.gpu
@needs_gpu
def test_ray_learner_actors_take_the_gpu(ray_session, tmp_path):
    overrides = {
        **QUIET,
        "env.num_envs": 4,
        "ppo.num_steps": 8,
        "ppo.minibatch_size": 16,
        "ppo.num_epochs": 1,
        "num_learners": 1,
        "run.device": "cuda",
    }
    result = shoal.train("ddppo", total_steps=32, run_dir=str(tmp_path), **overrides)
    assert result.env_steps >= 32
