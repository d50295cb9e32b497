"""Fixed-seed learning tests of the value-based family: the tuned examples solve CartPole."""

import pytest

import shoal
from shoal.collect.evaluate import evaluate

pytestmark = pytest.mark.learning

QUIET = {"run.console": False, "run.tensorboard": False, "run.checkpoint_every_steps": 0}


@pytest.mark.parametrize(
    "tuned", ["dqn-cartpole", "rainbow-cartpole", "qrdqn-cartpole", "rem-cartpole"]
)
def test_tuned_example_solves_cartpole(tuned, tmp_path):
    result = shoal.train(tuned=tuned, seed=0, run_dir=str(tmp_path / "run"), **QUIET)
    assert result.solved, result
    assert result.eval_return >= 475

    # Independent check on fresh environments, through the public loading path. A fresh
    # evaluation falls below the one the run stopped at (the stop picks a lucky one): over
    # seeds 0-4 the four examples' fresh means went down to 463.6 (QR-DQN; benchmarks/
    # spreads.py) and REM's to 466 on seed 2 (make test-learning-seeds), so the check asks
    # 425, as ACKTR's and ACER's do.
    policy = shoal.load(result.run_dir)
    env = shoal.make_env("CartPole-v1", num_envs=20)
    metrics = evaluate(policy, env, seed=2024)
    env.close()
    assert metrics["eval/return"] >= 425, metrics
