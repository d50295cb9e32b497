"""REINFORCE end to end on tiny settings: returns of complete episodes, carry-over, smoke,
NaN losses, exact resume."""

import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from state_helpers import assert_states_equal, metric_rows

import shoal
from shoal.algos.policy_gradient import pg
from shoal.algos.policy_gradient.pg import PG, PGConfig, PGLearner, make_batch
from shoal.config import EnvConfig, ModelConfig
from shoal.core.errors import ConfigError, NaNLossError
from shoal.core.types import Rollout
from shoal.train.checkpoint import load_checkpoint

ITERATION_STEPS = 64


def small_pg(**extra):
    overrides = {
        "env.num_envs": 4,
        "num_steps": 16,
        "model.hidden": (16,),
        "run.eval_every_steps": 0,
        "run.checkpoint_every_steps": 0,
        "run.console": False,
        "run.tensorboard": False,
    }
    overrides.update(extra)
    return overrides


def rollout(rewards, terminated, truncated, valid, first_obs=0.0):
    rewards = torch.tensor(rewards)
    t_, b_ = rewards.shape
    return Rollout(
        obs=torch.arange(first_obs, first_obs + t_ * b_).reshape(t_, b_, 1),
        actions=torch.zeros(t_, b_, dtype=torch.int64),
        log_probs=torch.zeros(t_, b_),
        values=torch.zeros(t_, b_),
        rewards=rewards,
        terminated=torch.tensor(terminated),
        truncated=torch.tensor(truncated),
        valid=torch.tensor(valid),
        last_values=torch.zeros(b_),
    )


def test_unfinished_episodes_are_carried_until_they_end():
    # env 0 terminates at t=0, autoresets at t=1 and starts a new episode at t=2; env 1 runs on.
    F, T = False, True
    first = rollout(
        [[1.0, 1.0], [0.0, 1.0], [1.0, 1.0]],
        [[T, F], [F, F], [F, F]],
        [[F, F]] * 3,
        [[T, T], [F, T], [T, T]],
    )
    batch, carry = make_batch(None, first, gamma=0.5, max_carry_steps=100)
    assert batch.obs.flatten().tolist() == [0.0] and batch.returns.tolist() == [1.0]
    assert carry.valid.tolist() == [[F, T], [F, T], [T, T]]
    # env 0's episode is cut by its time limit at t=0, env 1's terminates: both now complete.
    second = rollout(
        [[1.0, 1.0], [0.0, 0.0]], [[F, T], [F, F]], [[T, F], [F, F]], [[T, T], [F, F]], 6.0
    )
    batch, carry = make_batch(carry, second, gamma=0.5, max_carry_steps=100)
    assert carry is None
    assert batch.obs.flatten().tolist() == [1.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    # Truncation ends the episode without bootstrapping: env 0's return is 1 + 0.5 * 1.
    assert batch.returns.tolist() == [1.875, 1.75, 1.5, 1.5, 1.0, 1.0]


def test_carry_is_bounded_and_independent_of_the_sampler_buffers():
    data = rollout([[1.0], [1.0], [1.0]], [[False]] * 3, [[False]] * 3, [[True]] * 3)
    batch, carry = make_batch(None, data, gamma=0.9, max_carry_steps=2)
    assert batch.returns.numel() == 0
    assert carry.obs.flatten().tolist() == [1.0, 2.0]
    data.obs.zero_()
    assert carry.obs.flatten().tolist() == [1.0, 2.0]


def test_every_valid_transition_is_trained_once_or_still_carried():
    algo = PG(PGConfig(env=EnvConfig(num_envs=4), model=ModelConfig(hidden=(16,)), num_steps=8))
    trained = valid = 0
    for _ in range(12):
        metrics = algo.train_iteration()
        trained += metrics["train/samples"]
        valid += int(algo.sampler.runner.storage.valid.sum())
    assert trained > 0 and algo.carry is not None
    assert trained + int(algo.carry.valid.sum()) == valid
    assert metrics["train/carried_steps"] == int(algo.carry.valid.sum())
    algo.close()


@pytest.mark.parametrize("baseline", [True, False])
def test_losses(baseline):
    config = PGConfig(model=ModelConfig(hidden=(8,)), baseline=baseline, normalize_advantages=False)
    learner = PGLearner(config, gym.spaces.Box(-1.0, 1.0, (4,)), gym.spaces.Discrete(2))
    obs = torch.randn(5, 4)
    batch = pg.PGBatch(obs, torch.tensor([0, 1, 1, 0, 1]), torch.arange(5.0))
    losses = learner.losses(batch)
    dist, values = learner.model(obs)
    advantages = batch.returns - values if baseline else batch.returns
    expected = -(dist.log_prob(batch.actions) * advantages).mean()
    assert losses["policy"].item() == pytest.approx(expected.item(), rel=1e-5)
    assert ("value" in losses) == baseline
    assert list(losses)[-1] == "total"


@pytest.mark.parametrize(("env_id", "action_shape"), [("CartPole-v1", ()), ("Pendulum-v1", (1,))])
def test_pg_smoke(env_id, action_shape, tmp_path):
    seen = []
    result = shoal.train(
        "pg",
        env=env_id,
        seed=0,
        total_steps=2 * ITERATION_STEPS,
        run_dir=str(tmp_path / "run"),
        on_iteration=lambda steps, metrics: seen.append(dict(metrics)),
        **small_pg(**({"env.max_episode_steps": 10} if env_id == "Pendulum-v1" else {})),
    )
    assert result.env_steps == 2 * ITERATION_STEPS and result.iterations == 2
    assert (result.checkpoint / "state.pt").exists()
    assert any(m["train/samples"] > 0 for m in seen)
    for metrics in seen:
        if metrics["train/samples"]:
            assert math.isfinite(metrics["loss/total"]) and math.isfinite(metrics["loss/value"])
    policy = shoal.load(result.run_dir)
    env = shoal.make_env(env_id, num_envs=3)
    actions = policy.act(env.reset(seed=1))
    assert actions.shape == (3, *action_shape)
    assert all(env.action_space.contains(a) for a in actions)
    env.close()


def test_nan_loss_names_the_loss(tmp_path, monkeypatch):
    monkeypatch.setattr(pg, "value_loss", lambda v, r: (v - r).mean() * float("nan"))
    with pytest.raises(NaNLossError, match="loss/value"):
        shoal.train(
            "pg",
            run_dir=str(tmp_path / "run"),
            total_steps=20 * ITERATION_STEPS,
            **small_pg(**{"env.max_episode_steps": 8}),
        )


@pytest.mark.parametrize(
    ("env_id", "vectorization", "max_episode_steps"),
    [("CartPole-v1", "native", None), ("Pendulum-v1", "sync", 20)],
)
def test_resume_is_exact(env_id, vectorization, max_episode_steps, tmp_path):
    first, total = 2 * ITERATION_STEPS, 4 * ITERATION_STEPS
    overrides = small_pg(
        **{
            "env.vectorization": vectorization,
            "env.max_episode_steps": max_episode_steps,
            "env.normalize_obs": True,
            "optim.lr_schedule": "linear",
            "optim.anneal_steps": total,
            "run.checkpoint_every_steps": ITERATION_STEPS,
        }
    )
    run_a, run_b = str(tmp_path / "a"), str(tmp_path / "b")
    part = shoal.train("pg", env=env_id, seed=3, total_steps=first, run_dir=run_a, **overrides)
    resumed = shoal.train(resume=part.run_dir, total_steps=total)
    straight = shoal.train("pg", env=env_id, seed=3, total_steps=total, run_dir=run_b, **overrides)
    assert resumed.env_steps == straight.env_steps == total
    got, want = load_checkpoint(resumed.run_dir).state, load_checkpoint(straight.run_dir).state
    assert got["algorithm"]["carry"] is not None  # the carried episodes were saved too
    assert_states_equal(got["algorithm"], want["algorithm"])
    assert_states_equal(got["rng"], want["rng"])
    assert metric_rows(resumed.run_dir) == metric_rows(straight.run_dir)


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("num_steps", 0, "num_steps"),
        ("gamma", 1.5, "gamma"),
        ("vf_coef", -1.0, "vf_coef"),
        ("max_carry_steps", 0, "max_carry_steps"),
    ],
)
def test_config_validation(field, value, match):
    with pytest.raises(ConfigError, match=match):
        PGConfig(**{field: value})


def test_tuned_example_builds():
    config = shoal.registry.find_tuned("pg-cartpole").build_config()
    assert isinstance(config, PGConfig) and config.run.target_return == 475
    assert np.isclose(config.optim.lr, 0.01)
