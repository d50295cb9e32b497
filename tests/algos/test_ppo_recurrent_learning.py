"""Recurrent PPO solves the memory task that feed-forward PPO cannot (expected 1 / num_cues)."""

import pytest

import shoal

pytestmark = pytest.mark.learning

QUIET = {"run.console": False, "run.tensorboard": False, "run.checkpoint_every_steps": 0}


def test_lstm_recalls_the_first_observation_and_feed_forward_cannot(tmp_path):
    recurrent = shoal.train(
        "ppo", tuned="ppo-lstm-memory", seed=0, run_dir=str(tmp_path / "lstm"), **QUIET
    )
    assert recurrent.solved and recurrent.eval_return >= 0.95
    # Same settings without the LSTM, same budget the recurrent run needed and more: the last
    # observation is zeros whatever the cue, so the best feed-forward policy scores 1/4.
    feed_forward = shoal.train(
        "ppo",
        tuned="ppo-lstm-memory",
        seed=0,
        run_dir=str(tmp_path / "ff"),
        total_steps=2 * recurrent.env_steps,
        **{"model.lstm_hidden": None, "bptt_chunk": None, **QUIET},
    )
    assert not feed_forward.solved and feed_forward.eval_return < 0.5
