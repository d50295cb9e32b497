"""R2D2 on Ape-X's machinery: sequence shards, actors that cut and score sequences with the
epsilon ladder, and apex-r2d2 end to end on a local Ray (smoke, checkpoint, deployed policy;
the run of Ray's stand-in in this process, which resumes it)."""

import numpy as np
import pytest
import torch
from in_process_ray import assert_ray_run_is_the_in_process_run
from state_helpers import assert_resume_goes_on

import shoal
from shoal.algos.value.apex_actor import SequenceActor, exploration_scales, r2d2_priorities
from shoal.algos.value.apex_config import ApexR2D2Config, variant
from shoal.config import RunConfig
from shoal.data.segments import SequenceShard
from shoal.train.checkpoint import load_checkpoint

QUIET = {
    "run.eval_every_steps": 0,
    "run.checkpoint_every_steps": 0,
    "run.console": False,
    "run.tensorboard": False,
}
SMALL = {
    "run.runners": 2,
    "replay_shards": 2,
    "env.num_envs": 2,
    "rollout_steps": 8,
    "steps_per_iteration": 64,
    "weight_sync_every": 2,
    "training_intensity": 0.5,
    "r2d2.burn_in": 2,
    "r2d2.length": 4,
    "r2d2.period": 2,
    "r2d2.model.hidden": (16,),
    "r2d2.model.lstm_hidden": 8,
    "r2d2.replay.batch_size": 4,
    "r2d2.replay.learning_starts": 8,
    "r2d2.replay.buffer_size": 200,
    **QUIET,
}


def _config(**extra):
    return shoal.api.build_config("apex-r2d2", **{**SMALL, **extra})


def test_actor_cuts_scores_and_explores_with_its_ladder_epsilon():
    config = _config(env="shoal/CartPoleNoVelocity-v0")
    parts = variant(config)
    actor = SequenceActor(config, 1, parts)
    assert actor.model.epsilon.item() == pytest.approx(exploration_scales(config, parts)[1])
    batches = [actor.sample() for _ in range(4)]
    sequences = [b for b, _, _, _ in batches if b is not None]
    assert sequences, "four rollouts of 2 envs x 8 steps complete sequences of 6 steps"
    batch, priorities = next((b, p) for b, p, _, _ in batches if b is not None)
    assert batch["obs"].shape[1:] == (7, 2) and batch["state"].shape[1:] == (2, 8)
    assert priorities.shape == (len(batch["valid"]),) and (priorities >= 0).all()
    # The priorities are R2D2's, with the actor's network standing in for the target.
    want = r2d2_priorities(actor.model, batch, parts.inner).numpy()
    np.testing.assert_allclose(priorities, want)
    # New weights keep the actor's own epsilon.
    weights = {k: v.clone() for k, v in actor.model.state_dict().items()}
    weights["epsilon"] = torch.tensor(0.9)
    actor.set_weights({"model": weights})
    assert actor.model.epsilon.item() == pytest.approx(exploration_scales(config, parts)[1])


def test_sequence_shard_adds_samples_and_updates_priorities():
    shard = SequenceShard(capacity=8, alpha=1.0, seed=0)
    assert shard.sample_many(2, 4, 0.6) == []
    batch = {
        "obs": np.arange(3 * 5, dtype=np.float32).reshape(3, 5, 1),
        "valid": np.ones((3, 4), bool),
        "state": np.zeros((3, 2, 2), np.float32),
    }
    assert shard.add(batch, np.array([1.0, 0.0, 0.0])) == 3
    (sample,) = shard.sample_many(1, 16, 0.6)
    # Priority 1 against eps ~ 0: only the first sequence is drawn.
    assert (sample.indices == 0).all() and sample.fields["obs"].shape == (16, 5, 1)
    shard.update_priorities(np.array([0, 2]), np.array([0.0, 5.0]))
    (sample,) = shard.sample_many(1, 16, 0.6)
    assert (sample.indices == 2).all()


def test_config_checks():
    with pytest.raises(shoal.core.errors.ConfigError, match="runners"):
        ApexR2D2Config(run=RunConfig(runners=0))


def test_apex_r2d2_smoke_checkpoint_policy_and_resume(ray_session, tmp_path, monkeypatch):
    """On Ray with results taken in turn, the run of the stand-in in this process (which
    then resumes it)."""
    on_ray, seen = assert_ray_run_is_the_in_process_run(
        tmp_path, monkeypatch, "apex-r2d2", 4 * 64, env="shoal/RepeatFirst-v0",
        results_in_turn=True, **SMALL,
    )  # fmt: skip
    assert on_ray.env_steps >= 4 * 64 and on_ray.iterations == 4
    last = seen[-1]
    # Which iterations hold learner steps depends on how actors and learner interleave; the
    # throttle (training_intensity) guarantees some by the end, each with a finite loss.
    learned = [m["loss/td"] for m in seen if "loss/td" in m]
    assert last["train/grad_steps"] > 0 and learned and np.isfinite(learned).all()
    assert last["train/epsilon_mean"] == pytest.approx((0.4 + 0.4**8) / 2)
    assert last["train/replay_size"] > 0
    saved = load_checkpoint(on_ray.run_dir).state["algorithm"]
    assert saved["learner"]["grad_steps"] == last["train/grad_steps"]
    policy = shoal.load(on_ray.run_dir)
    actions = policy.act(np.zeros((3, 4), np.float32), episode_start=[True] * 3)
    assert actions.shape == (3,)
    assert_resume_goes_on(on_ray.run_dir, 8 * 64)


def test_a_learner_group_takes_the_shards_sequences(in_process_ray, forked_learners, tmp_path):
    """``run.learners 2``: two (forked) ranks split every batch of sequences from the shards
    (`SequenceShare`); the run learns, checkpoints the group and resumes."""
    seen = []
    result = shoal.train("apex-r2d2", env="shoal/RepeatFirst-v0", run_dir=str(tmp_path / "r"),
                         total_steps=4 * 64, on_iteration=lambda step, m: seen.append(m),
                         **{**SMALL, "run.learners": 2})  # fmt: skip
    learned = [m["loss/td"] for m in seen if "loss/td" in m]
    assert seen[-1]["train/grad_steps"] > 0 and learned and np.isfinite(learned).all()
    assert "group_rng" in load_checkpoint(result.run_dir).state["algorithm"]["learner"]
    assert_resume_goes_on(result.run_dir, 8 * 64)


def test_r2d2_samples_with_ray_runners(ray_session, tmp_path):
    # Plain r2d2 with run.runners: synchronous Ray runners, whose rollouts (with the states
    # before each step) are joined along the env axis and cut into sequences per env.
    seen = []
    result = shoal.train(
        "r2d2", env="shoal/CartPoleNoVelocity-v0", run_dir=str(tmp_path / "ray"),
        total_steps=6 * 64, on_iteration=lambda step, metrics: seen.append(metrics),
        **{
            "run.runners": 2, "env.num_envs": 2, "num_steps": 16, "burn_in": 2, "length": 4,
            "period": 2, "model.hidden": (16,), "model.lstm_hidden": 8,
            "replay.batch_size": 4, "replay.learning_starts": 8, **QUIET,
        },
    )  # fmt: skip
    assert result.env_steps == 6 * 64
    assert seen[-1]["train/sequences"] > 0 and np.isfinite(seen[-1]["loss/td"])


@pytest.mark.learning
def test_apex_r2d2_remembers_the_first_cue(ray_session, tmp_path):
    """shoal/RepeatFirst-v0 (repeat the cue of the first step, 4 cues; a feed-forward policy
    cannot beat 1/4 in expectation, tests/algos/test_corrections_learning.py): Ape-X R2D2
    with its defaults (2 actors, 1 shard), R2D2's target update every 100 steps, seed 0, until
    the deterministic evaluation (50 episodes, every 4,096 env steps) reaches 0.95. Results
    are taken in request order, so the run is the same however actors and learner are timed:
    1.0 at 8,192 env steps every time (13-20 s, Ray start included)."""
    result = shoal.train(
        "apex-r2d2", env="shoal/RepeatFirst-v0", seed=0, run_dir=str(tmp_path / "learn"),
        **{**QUIET, "run.total_steps": 60_000, "run.target_return": 0.95,
           "run.eval_every_steps": 4096, "run.eval_episodes": 50,
           "r2d2.target_update_every": 100, "steps_per_iteration": 512,
           "results_in_turn": True},
    )  # fmt: skip
    assert result.solved and result.eval_return >= 0.95, result
