"""Settings that were accepted and then ignored: each is now honoured, or refused by name
before anything is built. Every test here failed before its fix."""

import dataclasses
import json
import math
import re

import gymnasium as gym
import numpy as np
import pytest
import torch
from image_env import FakeImageEnv
from torch import nn

import shoal
from shoal.algos.continuous.d4pg import D4PG, D4PGConfig
from shoal.algos.policy_gradient.ppo import PPOConfig
from shoal.cli import main
from shoal.config import ModelConfig, from_dict, replace
from shoal.config.checks import check_numbers
from shoal.core.errors import ConfigError, ShoalError
from shoal.nn.cnn import build_encoder
from shoal.registry import ALGORITHMS, find_tuned
from shoal.search.mcts import MCTSConfig
from shoal.train.loop import check_runtime

QUIET = {
    "run.eval_every_steps": 0,
    "run.checkpoint_every_steps": 0,
    "run.console": False,
    "run.tensorboard": False,
}


@pytest.mark.parametrize("name", sorted(n for n, s in ALGORITHMS.items() if not s.runners))
def test_algorithms_without_runners_refuse_them(name):
    spec = ALGORITHMS[name]
    try:
        config = spec.default_config(**{"run.runners": 2})
    except ConfigError as exc:  # refused by the config itself (DD-PPO: num_learners instead)
        assert "runners" in str(exc)
        return
    why = re.escape(spec.no_runners or "samples in the learner's process")
    with pytest.raises(ConfigError, match=rf"run.runners = 2: {name} {why}"):
        check_runtime(spec, config)


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_algorithm_runs_a_learner_group_or_refuses_one_by_name(name):
    """``run.learners 2`` on every registered algorithm: the ones that declare learner groups
    accept it (tests/distributed/test_learner_group.py trains PPO's, A2C's, APPO's, IMPALA's,
    DQN's, SAC's and CQL's groups; tests/algos/test_*_group_step.py compare each one's update with
    one learner's), and a replay learner's needs a batch to split; every other one refuses it
    before anything is built, saying why (no gradients, or no groups yet)."""
    spec = ALGORITHMS[name]
    try:
        config = spec.default_config(**{"run.learners": 2})
    except ConfigError as exc:  # refused by the config itself
        assert "learners" in str(exc)
        return
    if spec.learner_groups:
        check_runtime(spec, config)
        assert spec.scaling()["learners"] == "run.learners"
        if name == "acer":  # its segments' env columns are split: one each at least
            columns = r"learners = 2 is invalid: must be <= the 1 env columns"
            with pytest.raises(ConfigError, match=columns):
                spec.algorithm_cls(replace(config, **{"env.num_envs": 1}))
        elif hasattr(config, "replay"):  # one row for each of 2 learners at least, or refused
            with pytest.raises(ConfigError, match=r"learners = 2 is invalid: must be <= replay"):
                spec.algorithm_cls(replace(config, **{"replay.batch_size": 1}))
        return
    why = "has no gradient steps to split"
    if spec.gradients:  # why it keeps one learner (A3C by design; the others not yet)
        why = spec.one_learner or "has no learner groups yet"
    with pytest.raises(ConfigError, match=re.escape(f"run.learners = 2: {name} {why}")):
        check_runtime(spec, config)


def test_runners_refused_stop_before_building_a_run(tmp_path):
    with pytest.raises(ConfigError, match="run.runners = 4: q-learning"):
        shoal.train("q-learning", run_dir=str(tmp_path / "r"), **QUIET, **{"run.runners": 4})
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("name", ["dqn", "sac"])
def test_sampling_ahead_in_the_learners_process_is_refused_by_name(name):
    """Without runners the sampler thread's action draws would share the learner's torch
    generator and a seeded run would not repeat: refused before anything is built."""
    with pytest.raises(ConfigError, match=r"ReplayConfig.max_lag = 1 is invalid: > 0 needs run"):
        ALGORITHMS[name].default_config(**{"replay.max_lag": 1})
    config = ALGORITHMS[name].default_config(**{"replay.max_lag": 1, "run.runners": 1})
    assert config.replay.max_lag == 1


def test_d4pg_learns_from_the_n_step_returns_its_config_names():
    config = D4PGConfig()
    assert config.replay.n_step == 5  # the paper's
    small = {"replay.buffer_size": 64, "replay.batch_size": 4, "replay.learning_starts": 4}
    algo = D4PG(replace(config, **small, **{"replay.n_step": 3}))
    try:
        assert algo.replay.n_step == 3
    finally:
        algo.close()
    # The tuned example's setting reaches the replay (it used to name a field nothing read).
    assert find_tuned("d4pg-pendulum").build_config().replay.n_step == 3
    with pytest.warns(UserWarning, match="'n_step' is now 'replay.n_step'"):
        old = shoal.build_config("d4pg", n_step=2)
    assert old.replay.n_step == 2


@pytest.mark.parametrize(
    "encoder, shape",
    [
        ("nature", (4, 84, 84)),
        ("batchnorm-cnn2", (4, 80, 80)),
        ("batchnorm-cnn3-lstm", (4, 80, 80)),
        ("impala", (3, 64, 64)),
    ],
)
def test_image_encoders_take_the_encoder_activation(encoder, shape):
    space = gym.spaces.Box(0, 255, shape, np.uint8)
    relu = build_encoder(space, ModelConfig(encoder=encoder))
    silu = build_encoder(space, ModelConfig(encoder=encoder, encoder_activation="silu"))
    silu.load_state_dict(relu.state_dict())
    assert not any(isinstance(m, nn.SiLU) for m in relu.modules())
    assert any(isinstance(m, nn.SiLU) for m in silu.modules())
    assert not any(isinstance(m, nn.ReLU) for m in silu.modules())
    relu.eval(), silu.eval()
    frames = torch.randint(0, 256, (2, *shape), dtype=torch.uint8)
    with torch.no_grad():
        assert not torch.allclose(relu(frames), silu(frames))
        if encoder in ("nature", "impala"):  # the FC layer's nonlinearity too
            features = silu(frames)
            assert (features < 0).any() and features.min() >= -0.2785  # SiLU's minimum


def test_lamb_et_al_model_3_with_silu_trains(tmp_path, registered_env):
    config = {
        **QUIET,
        "env.id": registered_env("FakeImageSiLU-v0", FakeImageEnv),
        "env.num_envs": 2,
        "model.encoder": "batchnorm-cnn3-lstm",
        "model.encoder_activation": "silu",
        "num_steps": 8,
        "run.total_steps": 16,
        "run.run_dir": str(tmp_path / "r"),
    }
    result = shoal.train("a2c", **config)
    assert result.env_steps == 16
    policy = shoal.load(result.run_dir)
    assert any(isinstance(m, nn.SiLU) for m in policy.model.modules())
    assert math.isfinite(float(sum(p.sum() for p in policy.model.parameters())))


def _evaluated_steps(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [row["step"] for row in rows if "eval/return" in row and "eval/final" not in row]


def test_a_resume_takes_the_evaluation_cadence_it_is_given(tmp_path, small_ppo):
    """Resuming with another run.eval_every_steps used to keep the checkpoint's schedule: the
    next evaluation came at the old cadence's next multiple (here never)."""
    run_dir = tmp_path / "r"
    first = small_ppo(**{"run.eval_every_steps": 10_000, "run.eval_episodes": 2})
    shoal.train("ppo", total_steps=128, run_dir=str(run_dir), **first)
    shoal.train(resume=run_dir, total_steps=512, quiet=True,
                **{"run.eval_every_steps": 128})  # fmt: skip
    assert _evaluated_steps(run_dir) == [256, 384, 512]
    # A target added on resume evaluates every iteration from there (eval_every_steps 0).
    shoal.train(resume=run_dir, total_steps=704, quiet=True,
                **{"run.eval_every_steps": 0, "run.target_return": 10_000.0})  # fmt: skip
    assert _evaluated_steps(run_dir) == [256, 384, 512, 576, 640, 704]


def test_an_unchanged_cadence_resumes_on_its_own_schedule(tmp_path, small_ppo):
    run_dir = tmp_path / "r"
    every = small_ppo(**{"run.eval_every_steps": 192, "run.eval_episodes": 2})
    shoal.train("ppo", total_steps=128, run_dir=str(run_dir), **every)
    shoal.train(resume=run_dir, total_steps=512, quiet=True)
    assert _evaluated_steps(run_dir) == [192, 384]


def test_evaluation_computes_with_the_run_s_torch_threads(tmp_path, small_ppo, capsys):
    run_dir = tmp_path / "r"
    shoal.train("ppo", total_steps=64, run_dir=str(run_dir), **small_ppo())
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        shoal.evaluate(run_dir, episodes=2)
        assert torch.get_num_threads() == 1  # the run's run.torch_threads
        torch.set_num_threads(2)
        assert main(["eval", str(run_dir), "--episodes", "2"]) == 0
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    capsys.readouterr()
    # No evaluation without episodes: said as such, not as an env setting.
    assert main(["eval", str(run_dir), "--episodes", "0"]) == 2
    said = capsys.readouterr().out
    assert "--episodes must be >= 1" in said and "num_envs" not in said
    with pytest.raises(ShoalError, match="episodes must be a whole number >= 1"):
        shoal.evaluate(run_dir, episodes=0)


@pytest.mark.parametrize(
    "field, value",
    [("c1", -1.0), ("c1", math.nan), ("dirichlet_alpha", -0.3), ("dirichlet_alpha", math.nan),
     ("c2", 0.0), ("c_scale", math.nan), ("c_visit", -1.0)],
)  # fmt: skip
def test_search_settings_refuse_negative_and_nan_values(field, value):
    with pytest.raises(ConfigError, match=rf"MCTSConfig.{field} = "):
        MCTSConfig(**{field: value})
    with pytest.raises(ConfigError, match=rf"{field}"):
        shoal.build_config("muzero", **{f"search.{field}": value})


def test_a_nan_setting_is_refused_before_a_run_is_made(tmp_path):
    with pytest.raises(ConfigError, match=r"RunConfig.target_return .*nan"):
        shoal.build_config("ppo", target_return=math.nan)
    with pytest.raises(ConfigError, match=r"must be a number, got nan"):
        from_dict(PPOConfig, {"ent_coef": "nan"})
    # A config built in Python, as the CLI builds it, reaches the loop's check.
    config = dataclasses.replace(PPOConfig(), ent_coef=math.nan)
    config = replace(config, **{"run.run_dir": str(tmp_path / "r"), **QUIET})
    with pytest.raises(ConfigError, match=r"PPOConfig.ent_coef = nan is invalid"):
        shoal.train(config)
    assert not (tmp_path / "r").exists()
    for spec in ALGORITHMS.values():  # no default is NaN
        check_numbers(spec.default_config())
