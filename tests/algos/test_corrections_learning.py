"""Fixed-seed learning tests of ACKTR, ACER and R2D2: ACKTR and ACER solve CartPole-v1; R2D2
solves the memory task shoal/RepeatFirst-v0, where a feed-forward DQN cannot do better than
guessing (expected return 1/4 with 4 cues), under the same budget.

Run only these with ``pytest -m learning``."""

import pytest

import shoal
from shoal.collect.evaluate import evaluate

pytestmark = pytest.mark.learning

QUIET = {"run.console": False, "run.tensorboard": False}


@pytest.mark.parametrize("tuned", ["acktr-cartpole", "acer-cartpole"])
def test_solves_cartpole(tuned, tmp_path):
    """Each example stops at an evaluation of 475 (5 of 5 seeds, benchmarks/spreads.py). A
    fresh evaluation of the final policy scored 452 to 500 over seeds 0-4 (ACKTR's seed 3:
    452; ACER's seed 4: 457), so the fresh check asks 425: below every seed measured, far
    above random play (about 22)."""
    result = shoal.train(tuned=tuned, seed=0, run_dir=str(tmp_path / "run"), **QUIET)
    assert result.solved and result.eval_return >= 475, result
    policy = shoal.load(result.run_dir)
    env = shoal.make_env("CartPole-v1", num_envs=20)
    metrics = evaluate(policy, env, seed=2024)
    env.close()
    assert metrics["eval/return"] >= 425, metrics


def test_r2d2_remembers_where_dqn_cannot(tmp_path):
    r2d2 = shoal.train(tuned="r2d2-repeat-first", seed=0, run_dir=str(tmp_path / "r2d2"), **QUIET)
    assert r2d2.solved and r2d2.eval_return >= 0.95, r2d2
    env = shoal.make_env("shoal/RepeatFirst-v0", num_envs=200)
    recalled = evaluate(shoal.load(r2d2.run_dir), env, seed=7)["eval/return"]
    assert recalled >= 0.95
    dqn = shoal.train(
        "dqn", env="shoal/RepeatFirst-v0", seed=0, total_steps=r2d2.env_steps,
        run_dir=str(tmp_path / "dqn"),
        **{"env.num_envs": 8, "exploration_steps": 10_000, "run.eval_every_steps": 0, **QUIET},
    )  # fmt: skip
    guessed = evaluate(shoal.load(dqn.run_dir), env, seed=7)["eval/return"]
    env.close()
    # 200 episodes of a 1-in-4 guess: mean 0.25, standard error about 0.03.
    assert guessed <= 0.4, guessed
