"""ACER end to end on tiny settings: segments keep the last observation, smoke (discrete and
continuous), replayed updates, NaN losses, exact resume with the replay saved, refusals."""

import math

import pytest
import torch
from state_helpers import assert_states_equal, metric_rows

import shoal
from shoal.algos.policy_gradient import acer
from shoal.algos.policy_gradient.acer import ACER, ACERConfig
from shoal.api import build_config
from shoal.config import ModelConfig
from shoal.core.errors import ConfigError, NaNLossError
from shoal.train.checkpoint import load_checkpoint

ITERATION_STEPS = 32  # 4 envs x 8 steps


def small(**extra):
    overrides = {
        "env.num_envs": 4,
        "num_steps": 8,
        "model.hidden": (16,),
        "replay.learning_starts": 32,
        "replay.buffer_size": 128,
        "run.eval_every_steps": 0,
        "run.checkpoint_every_steps": 0,
        "run.console": False,
        "run.tensorboard": False,
    }
    overrides.update(extra)
    return overrides


def test_segments_end_with_the_observation_after_the_rollout():
    algorithm = ACER(build_config("acer", seed=0, **small()))
    try:
        rollout, _ = algorithm.core.sample()
        segment = acer.segment_of(rollout, acer.behaviour_of(algorithm.learner, rollout.obs))
        assert segment["obs"].shape[0] == 9
        # Behaviour statistics are the acting policy's: its log-probs of the actions taken.
        dist = algorithm.learner.model.distribution_of(segment["behaviour"].flatten(0, 1))
        log_probs = dist.log_prob(rollout.actions.flatten()).view(8, 4)
        assert torch.allclose(log_probs, rollout.log_probs, atol=1e-5)
        # The next rollout starts from the last observation (the rollout's buffers are reused).
        last = segment["obs"][-1].clone()
        following, _ = algorithm.core.sample()
        assert torch.equal(last, following.obs[0])
    finally:
        algorithm.close()


@pytest.mark.parametrize(("env_id", "action_shape"), [("CartPole-v1", ()), ("Pendulum-v1", (1,))])
def test_smoke(env_id, action_shape, tmp_path):
    seen = []
    result = shoal.train(
        "acer", env=env_id, seed=0, total_steps=4 * ITERATION_STEPS,
        run_dir=str(tmp_path / "run"),
        on_iteration=lambda steps, metrics: seen.append(dict(metrics)), **small(),
    )  # fmt: skip
    assert result.iterations == 4
    assert sum(m["train/replayed_segments"] for m in seen) > 0
    for metrics in seen:
        assert all(math.isfinite(metrics[k]) for k in ("loss/policy", "loss/critic", "loss/total"))
    policy = shoal.load(result.run_dir)
    env = shoal.make_env(env_id, num_envs=3)
    actions = policy.act(env.reset(seed=1))
    assert actions.shape == (3, *action_shape)
    env.close()


def test_nan_loss_names_the_loss(tmp_path, monkeypatch):
    real = acer.retrace
    monkeypatch.setattr(acer, "retrace", lambda *a, **k: real(*a, **k) * float("nan"))
    # Q_ret feeds both the critic and the policy (its advantage): the first term is named.
    with pytest.raises(NaNLossError, match="loss/policy became nan"):
        shoal.train("acer", run_dir=str(tmp_path / "run"), total_steps=ITERATION_STEPS, **small())


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_resume_is_exact(env_id, tmp_path):
    first, total = 3 * ITERATION_STEPS, 6 * ITERATION_STEPS
    overrides = small(**{"replay.save": True, "run.checkpoint_every_steps": ITERATION_STEPS})
    run_a, run_b = str(tmp_path / "a"), str(tmp_path / "b")
    part = shoal.train("acer", env=env_id, seed=5, total_steps=first, run_dir=run_a, **overrides)
    resumed = shoal.train(resume=part.run_dir, total_steps=total)
    straight = shoal.train(
        "acer", env=env_id, seed=5, total_steps=total, run_dir=run_b, **overrides
    )
    got, want = load_checkpoint(resumed.run_dir).state, load_checkpoint(straight.run_dir).state
    assert_states_equal(got["algorithm"], want["algorithm"])
    assert metric_rows(resumed.run_dir) == metric_rows(straight.run_dir)


def test_the_average_network_trails_the_weights():
    algorithm = ACER(build_config("acer", seed=0, **small(average_decay=0.5)))
    try:
        before = [p.clone() for p in algorithm.learner.average.parameters()]
        algorithm.train_iteration()
        after = list(algorithm.learner.average.parameters())
        weights = list(algorithm.learner.model.parameters())
        moved = [not torch.equal(a, b) for a, b in zip(before, after, strict=True)]
        assert any(moved)
        assert not any(p.requires_grad for p in after)
        assert all(not torch.equal(a, w) for a, w in zip(after, weights, strict=True) if a.dim())
    finally:
        algorithm.close()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"model": ModelConfig(lstm_hidden=16)}, "lstm_hidden"),
        ({"truncation": 0.0}, "truncation"),
        ({"average_decay": 1.0}, "average_decay"),
        ({"delta": -1.0}, "delta"),
    ],
)
def test_config_refusals(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        ACERConfig(**kwargs)


def test_unsupported_action_space(tmp_path):
    with pytest.raises(shoal.core.errors.UnsupportedSpaceError, match="ACER supports"):
        shoal.train(
            "acer", env="tests.action_env:Actions-v0", run_dir=str(tmp_path / "r"),
            total_steps=ITERATION_STEPS, **small(**{"env.kwargs": {"kind": "multidiscrete"}}),
        )  # fmt: skip
