"""A user's encoder named by import path (``model.encoder module:Class``, `shoal.nn.custom`)."""

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import shoal
from shoal.core.errors import ConfigError
from shoal.envs.goal_line import ENV_ID
from tests.custom_nets import TinyEncoder

QUIET = {"run.console": False, "run.tensorboard": False, "run.checkpoint_every_steps": 0}
TINY = "tests.custom_nets:TinyEncoder"


@pytest.mark.parametrize(
    "algo, env, extra",
    [
        ("ppo", "CartPole-v1", {"env.num_envs": 4, "num_steps": 16, "minibatch_size": 32}),
        ("dqn", "CartPole-v1", {"replay.learning_starts": 64, "replay.batch_size": 32}),
        ("sac", "Pendulum-v1", {"replay.learning_starts": 64, "replay.batch_size": 32}),
    ],
)
def test_a_custom_encoder_trains_with_each_family(algo, env, extra, tmp_path):
    TinyEncoder.built.clear()
    result = shoal.train(
        algo,
        env=env,
        seed=0,
        total_steps=256,
        run_dir=str(tmp_path / "run"),
        **{"model.encoder": TINY, **QUIET, **extra},
    )
    assert TinyEncoder.built, "the encoder was never built"
    space, config = TinyEncoder.built[0].args
    assert space.shape == ((4,) if env == "CartPole-v1" else (3,))
    assert config.encoder == TINY  # the model config, as documented
    # Training moved the learner's encoders: gradients reach them (PPO: the actor's and the
    # critic's trunks; SAC: the actor's and the critics'; DQN: the Q-network's).
    trained = [e for e in TinyEncoder.built if not torch.equal(e.layer.weight, e.initial)]
    assert len(trained) >= (1 if algo == "dqn" else 2)
    policy = shoal.load(result.run_dir)
    assert any(isinstance(m, TinyEncoder) for m in policy.model.modules())
    obs = np.zeros(space.shape, np.float32)
    assert np.shape(policy.act(obs)) in ((), (1,))


def test_ppo_learns_with_a_custom_dict_encoder(tmp_path):
    result = shoal.train(
        "ppo",
        env=ENV_ID,
        seed=0,
        total_steps=30_000,
        run_dir=str(tmp_path / "run"),
        **{
            "model.encoder": "tests.custom_nets:GoalLineEncoder",
            "model.backend": "torch",
            "run.eval_every_steps": 10_000,
            "run.eval_episodes": 20,
            **QUIET,
        },
    )
    assert result.eval_return >= 0.9


@pytest.mark.parametrize(
    "path, message",
    [
        ("tests.no_such_module:Net", "cannot import module 'tests.no_such_module'"),
        ("tests.custom_nets:Missing", "has no 'Missing'"),
        ("tests.custom_nets:NoOutDim", "must set out_dim"),
        ("tests.custom_nets:Broken", "ValueError: this encoder needs images"),
        ("tests.custom_nets:WrongWidth", r"shape \[2, 8\] .* \[2, 16\]"),
        # A float-only encoder on a Dict space: named before training, not mid-way.
        ("tests.custom_nets:FloatOnly", r"fails on .* \(torch.uint8 \[2, 16\]\): .*unpack_tensor"),
    ],
)
def test_a_bad_encoder_is_a_clear_error_before_training(path, message, tmp_path):
    run_dir = tmp_path / "run"
    env = "shoal/GoalLine-v0" if path.endswith("FloatOnly") else "CartPole-v1"
    with pytest.raises(ConfigError, match=message):
        shoal.train("ppo", env=env, total_steps=64, run_dir=str(run_dir),
                    **{"model.encoder": path, **QUIET})  # fmt: skip
    assert not run_dir.exists()  # nothing left behind


def test_an_unknown_encoder_name_is_refused_by_the_config():
    with pytest.raises(ConfigError, match="module:Class"):
        shoal.build_config("ppo", **{"model.encoder": "resnet"})


def test_cli_imports_the_encoder_from_the_working_directory(tmp_path):
    (tmp_path / "mynets.py").write_text(
        textwrap.dedent(
            """
            import torch
            from torch import nn

            class Wide(nn.Module):
                def __init__(self, obs_space, config):
                    super().__init__()
                    self.layer = nn.Linear(obs_space.shape[0], 48)
                    self.out_dim = 48

                def forward(self, obs):
                    return torch.tanh(self.layer(obs))
            """
        )
    )
    cmd = [
        str(Path(sys.executable).with_name("shoal")), "train", "ppo", "--env.id", "CartPole-v1",
        "--total-steps", "256", "--model.encoder", "mynets:Wide", "--run-dir", "run",
        "--run.no-tensorboard",
    ]  # fmt: skip
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    # shoal.load from another directory imports the module from the run's record only when
    # the user trusts the run's code; without it, the error names the module and the way.
    code = (
        "import shoal, numpy as np; p = shoal.load('run', trust_code=TRUST); "
        "print(type(p.model.body.members[0]).__name__, p.act(np.zeros(4, np.float32)))"
    )
    for trust in (True, False):
        loaded = subprocess.run(
            [sys.executable, "-c",
             code.replace("'run'", repr(str(tmp_path / "run"))).replace("TRUST", str(trust))],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        if trust:
            assert loaded.returncode == 0, loaded.stderr
            assert loaded.stdout.startswith("Wide ")
        else:
            assert loaded.returncode != 0
            assert "module 'mynets' is not importable here" in loaded.stderr
            assert "--trust-code (trust_code=True in Python)" in loaded.stderr


@pytest.mark.parametrize("algo", ["ppo", "trpo"])
def test_a_custom_policy_head_trains(algo, tmp_path):
    result = shoal.train(
        algo,
        env="CartPole-v1",
        seed=0,
        total_steps=256,
        run_dir=str(tmp_path / "run"),
        **{"model.policy_head": "tests.custom_nets:HalfTemperatureHead", **QUIET},
    )
    policy = shoal.load(result.run_dir)
    assert type(policy.model.policy_head).__name__ == "HalfTemperatureHead"
    assert policy.act(np.zeros(4, np.float32)) in (0, 1)


def test_a_bad_policy_head_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="model.policy_head 'tests.custom_nets:Broken'"):
        shoal.train(
            "ppo",
            total_steps=64,
            run_dir=str(tmp_path / "run"),
            **{"model.policy_head": "tests.custom_nets:Broken", **QUIET},
        )
