"""Recurrent A2C (model.lstm_hidden): config checks, the replay of the rollout, smoke, exact
resume, and learning the memory task that feed-forward A2C cannot."""

import pytest
import torch
from state_helpers import assert_states_equal, metric_rows

import shoal
from shoal.algos.policy_gradient.a2c import A2C, A2CConfig
from shoal.algos.policy_gradient.ppo import make_sequence_batch
from shoal.config import EnvConfig, ModelConfig
from shoal.core.errors import ConfigError
from shoal.nn import RecurrentActorCritic
from shoal.train.checkpoint import load_checkpoint

MEMORY = "shoal/RepeatFirst-v0"
ITERATION_STEPS = 32  # 4 envs x 8 steps
QUIET = {"run.console": False, "run.tensorboard": False, "run.checkpoint_every_steps": 0}


def small_recurrent_a2c(**extra):
    overrides = {
        "env.num_envs": 4,
        "num_steps": 8,
        "model.hidden": (16,),
        "model.lstm_hidden": 8,
        "bptt_chunk": 4,
        "run.eval_every_steps": 0,
        **QUIET,
    }
    overrides.update(extra)
    return overrides


def lstm_config(**kwargs):
    env = EnvConfig(id=MEMORY, num_envs=4, kwargs={"num_cues": 2, "length": 3})
    return A2CConfig(
        env=env, model=ModelConfig(hidden=(16,), lstm_hidden=8), num_steps=16, **kwargs
    )


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"bptt_chunk": 5}, "bptt_chunk = 5 is invalid: must divide num_steps = 16"),
        ({"bptt_chunk": 0}, "bptt_chunk = 0 is invalid: must be > 0"),
    ],
)
def test_config_errors(changes, match):
    with pytest.raises(ConfigError, match=match):
        lstm_config(**changes)


def test_bptt_chunk_needs_a_recurrent_model():
    with pytest.raises(ConfigError, match="bptt_chunk = 8 is invalid: needs model.lstm_hidden"):
        A2CConfig(num_steps=16, bptt_chunk=8)


def test_chunk_defaults_to_the_whole_rollout():
    assert lstm_config().chunk == 16 and lstm_config(bptt_chunk=4).chunk == 4


@pytest.mark.parametrize("chunk", [None, 4])
def test_replay_matches_the_sampler(chunk):
    """The replayed valid steps have the values and log-probabilities the sampler saw (same
    weights), whatever the chunk."""
    config = lstm_config(bptt_chunk=chunk)
    algo = A2C(config)
    assert isinstance(algo.learner.model, RecurrentActorCritic)
    rollout, _ = algo.sampler.sample()
    assert not bool(rollout.valid.all())  # episodes of 3 steps: autoreset steps inside
    batch = make_sequence_batch(rollout, config.gamma, config.gae_lambda, config.num_steps)
    (dist, values), flat = algo.learner._replay(batch)
    assert values.shape[0] == int(rollout.valid.sum()) == flat.obs.shape[0]
    torch.testing.assert_close(values, flat.values, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dist.log_prob(flat.actions), flat.log_probs, rtol=1e-5, atol=1e-5)
    metrics = algo.learner.update(batch, lr=1e-3)
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values())
    algo.close()


def test_bptt_chunk_stops_the_gradient():
    """A chunk shorter than the episodes (3 steps) changes the gradient, not the loss."""
    whole, cut = lstm_config(), lstm_config(bptt_chunk=2)
    algo = A2C(whole)
    rollout, _ = algo.sampler.sample()
    batch = make_sequence_batch(rollout, whole.gamma, whole.gae_lambda, whole.num_steps)
    grads = []
    for config in (whole, cut):
        algo.learner.config = config
        losses = algo.learner.losses(batch)
        algo.learner.model.zero_grad()
        losses["total"].backward()
        grads.append(algo.learner.model.lstm.weight_hh_l0.grad.clone())
        torch.testing.assert_close(losses["total"], algo.learner.losses(batch)["total"])
    assert not torch.allclose(grads[0], grads[1])
    algo.close()


@pytest.mark.parametrize("env_id", [MEMORY, "CartPole-v1"])
def test_recurrent_smoke_and_load(env_id, tmp_path):
    result = shoal.train(
        "a2c",
        env=env_id,
        seed=0,
        total_steps=2 * ITERATION_STEPS,
        run_dir=str(tmp_path),
        **small_recurrent_a2c(),
    )
    assert result.iterations == 2
    state = load_checkpoint(result.run_dir).state["algorithm"]["sampler"]["runners"][0]
    assert state["policy_state"].shape == (4, 2, 8)
    policy = shoal.load(result.run_dir)
    env = shoal.make_env(env_id, num_envs=3)
    obs = env.reset(seed=1)
    for _ in range(3):
        obs = env.step(policy.act(obs)).obs
    env.close()


def test_recurrent_resume_is_exact(tmp_path):
    overrides = small_recurrent_a2c(
        **{
            "env.kwargs": {"num_cues": 3, "length": 5},
            "optimizer": "adam",
            "run.checkpoint_every_steps": ITERATION_STEPS,
        }
    )
    first, total = 3 * ITERATION_STEPS, 5 * ITERATION_STEPS
    run_a, run_b = str(tmp_path / "a"), str(tmp_path / "b")
    part = shoal.train("a2c", env=MEMORY, seed=2, total_steps=first, run_dir=run_a, **overrides)
    resumed = shoal.train(resume=part.run_dir, total_steps=total)
    straight = shoal.train("a2c", env=MEMORY, seed=2, total_steps=total, run_dir=run_b, **overrides)
    assert resumed.env_steps == straight.env_steps == total
    got, want = load_checkpoint(resumed.run_dir).state, load_checkpoint(straight.run_dir).state
    assert_states_equal(got["algorithm"], want["algorithm"])
    assert metric_rows(resumed.run_dir) == metric_rows(straight.run_dir)


MEMORY_TASK = {
    "env.num_envs": 32,
    "env.kwargs": {"num_cues": 4, "length": 8},
    "model.hidden": (64,),
    "model.activation": "relu",
    "num_steps": 32,
    "optimizer": "adam",
    "optim.lr": 3e-3,
    "gamma": 0.99,
    "gae_lambda": 0.95,
    "ent_coef": 0.01,
    "normalize_advantages": True,
    "run.total_steps": 300_000,
    "run.target_return": 0.95,
    "run.eval_every_steps": 8192,
    "run.eval_episodes": 32,
    **QUIET,
}


@pytest.mark.learning
def test_lstm_a2c_recalls_the_first_observation_and_feed_forward_cannot(tmp_path):
    recurrent = shoal.train(
        "a2c",
        env=MEMORY,
        seed=0,
        run_dir=str(tmp_path / "lstm"),
        **{**MEMORY_TASK, "model.lstm_hidden": 64, "bptt_chunk": 16},
    )
    assert recurrent.solved and recurrent.eval_return >= 0.9
    # Same settings without the LSTM and twice the budget: the last observation is zeros
    # whatever the cue, so the best feed-forward policy scores 1/4.
    feed_forward = shoal.train(
        "a2c",
        env=MEMORY,
        seed=0,
        run_dir=str(tmp_path / "ff"),
        **{**MEMORY_TASK, "run.total_steps": 2 * recurrent.env_steps},
    )
    assert not feed_forward.solved and feed_forward.eval_return < 0.5
