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
from shoal.algos.policy_gradient.ppo import RolloutBatch
from shoal.config import RunConfig
from shoal.core.device import (
    autocast_dtype,
    check_precision,
    grad_scaler,
    resolve_device,
    to_device,
    to_host,
)
from shoal.core.errors import ConfigError
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
    "acktr": {"env.num_envs": 4, "num_steps": 8},
    "acer": {
        "env.num_envs": 4,
        "num_steps": 8,
        "replay.learning_starts": 32,
        "replay.save": True,
    },
    "r2d2": {
        "env.num_envs": 4,
        "num_steps": 8,
        "burn_in": 2,
        "length": 4,
        "period": 2,
        "model.lstm_hidden": 8,
        **REPLAY,
    },
}
ALIASES = {"ppo-lstm": "ppo", "rainbow": "dqn"}


def learner_networks(algo) -> torch.nn.Module:
    learner = getattr(algo, "learner", algo)  # A3C's driver is its learner
    for name in ("model", "online"):
        if hasattr(learner, name):
            return getattr(learner, name)
    return learner.core.critic


def train_small(name: str, device: str, run_dir, **extra):
    algo = ALIASES.get(name, name)
    overrides = {**QUIET, **SMALL[name], "run.device": device, **extra}
    return shoal.train(algo, seed=1, total_steps=32, run_dir=str(run_dir), **overrides)


def learner_devices(algo) -> set[str]:
    """The device types of what must live on ``run.device`` while a run trains: the learner's
    networks and its optimizer's state (moments and squared averages; not Adam's step
    counts, which PyTorch may keep on the CPU)."""
    learner = getattr(algo, "learner", algo)
    owners = [learner] + ([learner.core] if hasattr(learner, "core") else [])
    optimizers = [o for owner in owners for o in vars(owner).values()
                  if isinstance(o, torch.optim.Optimizer)]  # fmt: skip
    state = [
        v for o in optimizers for s in o.state.values() for v in s.values() if torch.is_tensor(v)
    ]
    tensors = list(learner_networks(algo).parameters()) + [v for v in state if v.dim() > 0]
    assert state, "the optimizer has taken steps"
    return {tensor.device.type for tensor in tensors}


class DeviceRecorder:
    """A callback that records `learner_devices` after every iteration."""

    def on_train_start(self, context):
        self.algorithm, self.seen = context._algorithm, []

    def on_iteration(self, metrics):
        if any(key.startswith("loss/") for key in metrics):
            self.seen.append(learner_devices(self.algorithm))


def smoke(name: str, device: str, tmp_path) -> None:
    """Train, checkpoint, load: the learner's networks and optimizer state were on
    ``device`` while it trained, and the deployed policy acts on the CPU."""
    recorder = DeviceRecorder()
    result = train_small(name, device, tmp_path / name, callbacks=[recorder])
    assert result.env_steps >= 32 and recorder.seen
    assert all(seen == {device} for seen in recorder.seen), recorder.seen
    assert load_checkpoint(result.run_dir).meta["env_steps"] == result.env_steps
    policy = shoal.load(result.run_dir)
    assert all(p.device.type == "cpu" for p in policy.model.parameters())


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
    batch = RolloutBatch(*(torch.zeros(3) for _ in range(6)))
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
@pytest.mark.parametrize("name", ["ppo", "a2c", "dqn", "sac", "maddpg", "acktr", "acer", "r2d2"])
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


# --- the distributed and multi-policy learners, and the compiler, on a GPU -----------------------

GPU_RUN = {**QUIET, "run.device": "cuda"}


@pytest.mark.gpu
@needs_gpu
def test_appo_learns_on_cuda_while_its_sampler_acts_on_the_cpu(tmp_path):
    recorder = DeviceRecorder()
    settings = {"env.num_envs": 4, "ppo.num_steps": 8, "ppo.minibatch_size": 16}
    result = shoal.train("appo", total_steps=96, run_dir=str(tmp_path), callbacks=[recorder],
                         **GPU_RUN, **settings)  # fmt: skip
    assert result.env_steps >= 96 and recorder.seen and all(s == {"cuda"} for s in recorder.seen)
    assert all(p.device.type == "cpu" for p in shoal.load(result.run_dir).model.parameters())


@pytest.mark.gpu
@needs_gpu
def test_apex_learner_on_cuda_with_ray_actors(ray_session, tmp_path):
    recorder = DeviceRecorder()
    settings = {"run.runners": 2, "replay_shards": 1, "env.num_envs": 2, "rollout_steps": 8,
                "steps_per_iteration": 64, "dqn.replay.batch_size": 16,
                "dqn.replay.learning_starts": 32, "dqn.replay.buffer_size": 500,
                "dqn.model.hidden": (16,)}  # fmt: skip
    result = shoal.train("apex-dqn", total_steps=256, run_dir=str(tmp_path), callbacks=[recorder],
                         **GPU_RUN, **settings)  # fmt: skip
    assert result.env_steps >= 256 and recorder.seen and all(s == {"cuda"} for s in recorder.seen)


@pytest.mark.gpu
@needs_gpu
def test_distributed_maddpg_learners_take_the_gpu(ray_session, tmp_path):
    settings = {"run.runners": 1, "num_learners": 2, "env.num_envs": 4,
                "maddpg.rollout_steps": 2, "maddpg.replay.batch_size": 16,
                "maddpg.replay.learning_starts": 8, "maddpg.replay.buffer_size": 400,
                "maddpg.model.hidden": (16,), "sync_every": 2}  # fmt: skip
    result = shoal.train("maddpg-distributed", total_steps=64, run_dir=str(tmp_path),
                         **GPU_RUN, **settings)  # fmt: skip
    assert result.env_steps >= 64
    assert any(key.startswith("loss/") for row in metric_rows(result.run_dir) for key in row)


@pytest.mark.gpu
@needs_gpu
def test_ddppo_with_two_learners_sharing_one_gpu(ray_session, tmp_path):
    """Two ranks on one device: NCCL refuses that, so they all-reduce through gloo."""
    settings = {"num_learners": 2, "env.num_envs": 4, "ppo.num_steps": 8,
                "ppo.minibatch_size": 16, "ppo.num_epochs": 1}  # fmt: skip
    result = shoal.train("ddppo", total_steps=64, run_dir=str(tmp_path), **GPU_RUN, **settings)
    assert result.env_steps >= 64


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize(
    "settings",
    [
        {"env.id": "shoal/tag-v0", "env.policy_per_agent": True},  # several policies
        pytest.param(
            {
                "env.id": "pettingzoo:pettingzoo.classic.tictactoe_v3",
                "self_play.snapshot_every": 1,
                "self_play.pool_size": 2,
            },
            marks=pytest.mark.extra("pettingzoo"),
            id="self-play",
        ),
    ],
    ids=["policy-per-agent", "self-play"],
)
def test_several_policies_and_self_play_train_on_cuda(settings, tmp_path):
    common = {"env.num_envs": 4, "num_steps": 8, "minibatch_size": 16, "num_epochs": 1}
    result = shoal.train("ippo", total_steps=96, run_dir=str(tmp_path), **GPU_RUN, **common,
                         **settings)  # fmt: skip
    assert result.env_steps >= 96
    assert any(key.startswith("loss/") for row in metric_rows(result.run_dir) for key in row)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("name", ["ppo", "dqn"])
def test_compiled_learners_train_on_cuda(name, tmp_path):
    recorder = DeviceRecorder()
    result = train_small(name, "cuda", tmp_path, callbacks=[recorder], **{"run.compile": True})
    assert recorder.seen and all(s == {"cuda"} for s in recorder.seen)
    assert all(p.device.type == "cpu" for p in shoal.load(result.run_dir).model.parameters())


@pytest.mark.gpu
@needs_gpu
def test_replay_hands_batches_to_cuda_through_pinned_staging():
    """Batches arrive on the GPU equal to the CPU gather, and one in flight is not
    overwritten by the next samples (the staging's two buffer sets in turn)."""
    import gymnasium as gym

    from shoal.data.replay import ReplayBuffer

    def buffer(device):
        replay = ReplayBuffer(64, 2, gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(4),
                              n_step=2, seed=0, device=device)  # fmt: skip
        rng = np.random.default_rng(0)
        for t in range(20):
            replay.add(rng.normal(size=(2, 3)), rng.integers(4, size=2), rng.normal(size=2),
                       np.array([t % 7 == 6] * 2), np.zeros(2, bool), np.ones(2, bool))  # fmt: skip
        return replay

    on_gpu, on_cpu = buffer("cuda"), buffer(None)
    batches = [on_gpu.sample(8) for _ in range(3)]
    wanted = [on_cpu.sample(8) for _ in range(3)]
    for got, want in zip(batches, wanted, strict=True):
        assert got.obs.is_cuda and got.weights.is_cuda
        for a, b in zip(got, want, strict=True):
            if torch.is_tensor(a):
                torch.testing.assert_close(a.cpu(), b)
