"""Fixed-seed learning tests of tabular TD control: the tuned examples solve their envs.

Run only these with ``pytest -m learning``; skip them with ``pytest -m "not learning"``.
"""

import numpy as np
import pytest

import shoal
from shoal.collect.evaluate import evaluate
from shoal.config import EnvConfig

pytestmark = pytest.mark.learning

QUIET = {"run.console": False, "run.tensorboard": False}
UP, RIGHT, DOWN = 0, 1, 2  # CliffWalking's actions (3 is left)


def test_q_learning_finds_the_optimal_cliff_path(tmp_path):
    result = shoal.train(
        tuned="q-learning-cliffwalking", seed=0, run_dir=str(tmp_path / "run"), **QUIET
    )
    assert result.solved and result.eval_return == -13, result

    # The exported greedy policy is the path along the cliff edge (S&B Example 6.6): up from
    # the start (row 3, column 0), right along row 2, then down onto the goal.
    policy = shoal.load(result.run_dir)
    greedy = policy.model.greedy_actions().reshape(4, 12)
    assert greedy[3, 0] == UP
    assert (greedy[2, :11] == RIGHT).all()
    assert greedy[2, 11] == DOWN

    env = shoal.make_env(EnvConfig(id="CliffWalking-v1", num_envs=5, max_episode_steps=200))
    metrics = evaluate(policy, env, seed=2024)
    env.close()
    assert metrics["eval/return"] == -13 and metrics["eval/length"] == 13, metrics


def test_sarsa_lambda_solves_nonslippery_frozenlake(tmp_path):
    result = shoal.train(
        tuned="sarsa-lambda-frozenlake", seed=0, run_dir=str(tmp_path / "run"), **QUIET
    )
    assert result.solved and result.eval_return == 1.0, result

    policy = shoal.load(result.run_dir)
    env = shoal.make_env(policy.config.env.id, num_envs=10, kwargs={"is_slippery": False})
    metrics = evaluate(policy, env, seed=2024)
    env.close()
    assert metrics["eval/return"] == 1.0, metrics  # every episode reaches the goal


@pytest.mark.parametrize("name", ["q-learning", "sarsa", "expected-sarsa", "q-lambda"])
def test_every_method_solves_nonslippery_frozenlake(name, tmp_path):
    """The other update rules, with the tuned example's settings."""
    result = shoal.train(
        tuned="sarsa-lambda-frozenlake",
        method=name.replace("-", "_"),
        seed=0,
        total_steps=20_000,
        run_dir=str(tmp_path / "run"),
        **QUIET,
    )
    assert result.solved, result
    greedy = shoal.load(result.run_dir).model.greedy_actions()
    assert greedy.shape == (16,) and np.isin(greedy, range(4)).all()
