"""Fixed-seed learning tests: the tuned examples must solve their environments.

Run only these with ``pytest -m learning``; skip them with ``pytest -m "not learning"``.
"""

import pytest

import shoal
from shoal.collect.evaluate import evaluate

pytestmark = pytest.mark.learning

QUIET = {"run.console": False, "run.tensorboard": False}


def test_ppo_solves_cartpole(tmp_path):
    result = shoal.train(tuned="ppo-cartpole", seed=0, run_dir=str(tmp_path / "run"), **QUIET)
    assert result.solved, result
    assert result.eval_return >= 475

    # Independent check on fresh environments, through the public loading path.
    policy = shoal.load(result.run_dir)
    env = shoal.make_env("CartPole-v1", num_envs=20)
    metrics = evaluate(policy, env, seed=2024)
    env.close()
    assert metrics["eval/return"] >= 475, metrics


def test_ppo_solves_pendulum(tmp_path):
    result = shoal.train(tuned="ppo-pendulum", seed=0, run_dir=str(tmp_path / "run"), **QUIET)
    assert result.eval_return is not None and result.eval_return >= -250, result

    policy = shoal.load(result.run_dir)
    env = shoal.make_env("Pendulum-v1", num_envs=20)
    metrics = evaluate(policy, env, seed=2024)
    env.close()
    assert metrics["eval/return"] >= -250, metrics
