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

    # Independent check on fresh environments, through the public loading path.
    policy = shoal.load(result.run_dir)
    env = shoal.make_env("CartPole-v1", num_envs=20)
    metrics = evaluate(policy, env, seed=2024)
    env.close()
    assert metrics["eval/return"] >= 475, metrics
