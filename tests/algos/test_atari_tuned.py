"""Smoke runs of the Atari tuned examples: each trains a few thousand frames with its own
preprocessing, model and algorithm settings (shortened budgets and buffers), checkpoints, and
its saved policy plays through `shoal.load`."""

import numpy as np
import pytest

import shoal
from shoal.train.checkpoint import load_checkpoint

pytest.importorskip("ale_py", reason="needs the atari extra: pip install 'shoal[atari]'")

QUICK = {
    "env.num_envs": 2,
    "run.total_steps": 512,  # agent steps: 2048 frames
    "run.eval_every_steps": 0,
    "run.checkpoint_every_steps": 0,
    "run.console": False,
    "run.tensorboard": False,
}
SHORTER = {
    "ppo-pong": {},
    "ppo-breakout": {},
    "appo-pong": {},
    "a2c-pong": {},
    "dqn-pong": {
        "replay.buffer_size": 2000,
        "replay.learning_starts": 256,
        "replay.gradient_steps": 2,
    },
    "rainbow-breakout": {
        "replay.buffer_size": 2000,
        "replay.learning_starts": 256,
        "replay.gradient_steps": 2,
    },
    "a2c-lstm-breakout": {"num_steps": 64, "bptt_chunk": 32},
    "a2c-cnn-pong": {},
    "a2c-lstm-pong": {},
    # Four updates and one eigendecomposition: each update multiplies the dense layer's
    # gradient by its 3137 x 3137 eigenbasis (about 10 GFLOP), the decomposition itself takes
    # about 8 s on 2 cores; acktr-breakout differs from it in the game only.
    "acktr-pong": {"num_steps": 64, "kfac.inverse_every": 1000},
    "acer-pong": {"num_steps": 8, "replay.buffer_size": 256, "replay.learning_starts": 32},
    "r2d2-pong": {
        "num_steps": 16,
        "burn_in": 4,
        "length": 8,
        "period": 4,
        "model.lstm_hidden": 32,
        "replay.buffer_size": 64,
        "replay.batch_size": 4,
        "replay.learning_starts": 8,
    },
}


@pytest.mark.parametrize("tuned", list(SHORTER))
def test_tuned_atari_example_trains_checkpoints_and_plays(tuned, tmp_path):
    result = shoal.train(
        tuned=tuned, seed=0, run_dir=str(tmp_path / tuned), **QUICK, **SHORTER[tuned]
    )
    assert result.env_steps >= 512
    checkpoint = load_checkpoint(result.run_dir)
    assert checkpoint.state["algorithm"]["counters"]["env_steps"] == result.env_steps
    policy = shoal.load(result.run_dir)
    env = shoal.make_env(policy.config.env, num_envs=2)
    obs = env.reset(seed=0)
    assert obs.dtype == np.uint8  # frames stay uint8 end to end
    actions = policy.act(obs)
    assert actions.shape == (2,)
    env.close()
