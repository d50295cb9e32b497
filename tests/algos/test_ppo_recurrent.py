"""Recurrent PPO (model.lstm_hidden): config checks, sequence batches, smoke, exact resume."""

import pytest
import torch
from state_helpers import assert_states_equal, metric_rows

import shoal
from shoal.algos.policy_gradient.ppo import PPO, PPOConfig, PPOLearner, make_sequence_batch
from shoal.config import EnvConfig, ModelConfig
from shoal.core.errors import ConfigError
from shoal.fast.backend import evaluate_objective
from shoal.train.checkpoint import load_checkpoint

MEMORY = "shoal/RepeatFirst-v0"


def lstm_config(**kwargs):
    env = EnvConfig(id=MEMORY, num_envs=4, kwargs={"num_cues": 2, "length": 3})
    kwargs = {"bptt_chunk": 8, "minibatch_size": 32, **kwargs}
    return PPOConfig(
        env=env,
        model=ModelConfig(hidden=(16,), lstm_hidden=8),
        num_steps=16,
        num_epochs=2,
        **kwargs,
    )


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"bptt_chunk": 5}, "bptt_chunk = 5 is invalid: must divide num_steps = 16"),
        (
            {"minibatch_size": 20},
            "minibatch_size = 20 is invalid: must be a multiple of bptt_chunk = 8",
        ),
        ({"bptt_chunk": 0}, "bptt_chunk = 0 is invalid: must be > 0"),
    ],
)
def test_config_errors(changes, match):
    with pytest.raises(ConfigError, match=match):
        lstm_config(**changes)


def test_bptt_chunk_needs_a_recurrent_model():
    with pytest.raises(ConfigError, match="bptt_chunk = 8 is invalid: needs model.lstm_hidden"):
        PPOConfig(bptt_chunk=8)


@pytest.mark.parametrize("chunk", [256, 512, 768])
def test_reference_chunk_sizes_are_expressible(chunk):
    config = PPOConfig(
        env=EnvConfig(num_envs=2),
        model=ModelConfig(lstm_hidden=64),
        num_steps=1536,
        bptt_chunk=chunk,
        minibatch_size=1536,
    )
    assert config.chunk == chunk


def test_first_minibatch_is_at_the_rollout_policy():
    """The recomputed piece states equal the sampler's: ratio 1, no KL before any step."""
    config = lstm_config(bptt_chunk=4, minibatch_size=16)
    algo = PPO(config)
    rollout, _ = algo.sampler.sample()
    batch = make_sequence_batch(rollout, config.gamma, config.gae_lambda, config.chunk)
    assert batch.chunks.obs.shape[:2] == (4, 16)
    assert int(batch.valid.sum()) == int(rollout.valid.sum())
    learner: PPOLearner = algo.learner
    for minibatch, outputs in learner._sequence_epoch(batch):
        objective = learner.objective(0.2, 0.0)
        _, stats = evaluate_objective(learner.model, objective, minibatch, outputs)
        assert abs(stats["approx_kl"].item()) < 1e-6
        assert abs(stats["ratio_mean"].item() - 1.0) < 1e-5
    metrics = learner.update(batch, lr=1e-2, clip_eps=0.2, kl_coeff=0.0)
    assert metrics["train/epochs"] == 2 and torch.isfinite(torch.tensor(metrics["loss/total"]))
    algo.close()


@pytest.mark.parametrize("env_id", [MEMORY, "CartPole-v1", "Pendulum-v1"])
def test_recurrent_smoke_and_load(env_id, tmp_path, small_ppo, iteration_steps):
    overrides = small_ppo(**{"model.lstm_hidden": 8, "bptt_chunk": 8})
    result = shoal.train(
        "ppo",
        env=env_id,
        seed=0,
        total_steps=2 * iteration_steps,
        run_dir=str(tmp_path),
        **overrides,
    )
    assert result.iterations == 2
    state = load_checkpoint(result.run_dir).state["algorithm"]["sampler"]["runners"][0]
    assert state["policy_state"].shape == (4, 2, 8)
    policy = shoal.load(result.run_dir)
    env = shoal.make_env(env_id, num_envs=3)
    obs = env.reset(seed=1)
    for _ in range(3):
        obs = env.step(policy.act(obs)).obs


def test_recurrent_resume_is_exact(tmp_path, small_ppo, iteration_steps):
    overrides = small_ppo(
        **{
            "model.lstm_hidden": 8,
            "bptt_chunk": 4,
            "env.kwargs": {"num_cues": 3, "length": 5},
            "run.checkpoint_every_steps": iteration_steps,
        }
    )
    first, total = 3 * iteration_steps, 5 * iteration_steps
    run_a, run_b = str(tmp_path / "a"), str(tmp_path / "b")
    part = shoal.train("ppo", env=MEMORY, seed=2, total_steps=first, run_dir=run_a, **overrides)
    resumed = shoal.train(resume=part.run_dir, total_steps=total)
    straight = shoal.train("ppo", env=MEMORY, seed=2, total_steps=total, run_dir=run_b, **overrides)
    got, want = load_checkpoint(resumed.run_dir).state, load_checkpoint(straight.run_dir).state
    assert_states_equal(got["algorithm"], want["algorithm"])
    assert metric_rows(resumed.run_dir) == metric_rows(straight.run_dir)
