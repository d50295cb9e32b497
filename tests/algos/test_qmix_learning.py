"""The two-step game (Rashid et al. 2018, Figure 3): with uniformly random exploration, QMIX's
monotonic mixer represents the payoff of state 2B and its greedy joint policy earns 8; VDN's
additive factorization and independent learners settle for the safe 7."""

import pytest

import shoal

pytestmark = pytest.mark.learning

# The paper's setting: epsilon = 1 throughout (uniform data), greedy evaluation. 32 envs x 2
# steps per iteration, 4 gradient steps on 32 episodes each: ~3 s per run on one core.
TWO_STEP = {
    "env.num_envs": 32,
    "rollout_steps": 2,
    "replay.batch_size": 32,
    "replay.learning_starts": 32,
    "replay.gradient_steps": 4,
    "replay.buffer_size": 500,
    "target_update_every": 20,
    "epsilon_start": 1.0,
    "epsilon_end": 1.0,
    "model.hidden": (32,),
    "rnn_hidden": 32,
    "run.eval_every_steps": 6144,
    "run.eval_episodes": 4,
    "run.checkpoint_every_steps": 0,
    "run.console": False,
    "run.tensorboard": False,
}


@pytest.mark.parametrize(("algo", "expected"), [("qmix", 8.0), ("vdn", 7.0), ("iql", 7.0)])
def test_two_step_game(algo, expected, tmp_path):
    result = shoal.train(algo, run_dir=str(tmp_path / algo), total_steps=12288, seed=0, **TWO_STEP)
    assert result.eval_return == expected
