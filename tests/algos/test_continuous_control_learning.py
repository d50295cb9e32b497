"""Fixed-seed learning tests of the off-policy actor-critics: the tuned examples swing
Pendulum-v1 up (the issue's bar: mean return >= -250)."""

import pytest

import shoal
from shoal.collect.evaluate import evaluate

pytestmark = pytest.mark.learning

QUIET = {"run.console": False, "run.tensorboard": False, "run.checkpoint_every_steps": 0}


@pytest.mark.parametrize(
    "tuned", ["sac-pendulum", "td3-pendulum", "ddpg-pendulum", "d4pg-pendulum"]
)
def test_tuned_example_swings_pendulum_up(tuned, tmp_path):
    result = shoal.train(tuned=tuned, seed=0, run_dir=str(tmp_path / "run"), **QUIET)
    assert result.solved, result  # the tuned examples stop at an evaluation of -200 or better

    # Independent check on fresh environments, through the public loading path.
    policy = shoal.load(result.run_dir)
    env = shoal.make_env("Pendulum-v1", num_envs=10)
    metrics = evaluate(policy, env, seed=2024)
    env.close()
    assert metrics["eval/return"] >= -250, metrics
