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


SEEDS = range(5)
"""Five seeds a check: QMIX finds 8 on most seeds, not all. Over seeds 0-9 it earned 8 on 7
(7 on seeds 4, 6 and 9), so every window of five seeds held at least 3 eights, which the
check asks (``make test-learning-seeds`` shifts the window); VDN and IQL earned 7 on all 10,
and no seed of theirs can earn 8 (their factorizations cannot represent it)."""


@pytest.mark.parametrize(("algo", "eights"), [("qmix", 3), ("vdn", 0), ("iql", 0)])
def test_two_step_game(algo, eights, tmp_path):
    returns = [
        shoal.train(algo, run_dir=str(tmp_path / f"{algo}{seed}"), total_steps=12288,
                    seed=seed, **TWO_STEP).eval_return
        for seed in SEEDS
    ]  # fmt: skip
    assert set(returns) <= {7.0, 8.0}, returns  # the safe 7 at worst
    if eights:
        assert returns.count(8.0) >= eights, returns
    else:
        assert returns == [7.0] * len(SEEDS), returns
