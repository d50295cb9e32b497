"""What ``run.total_steps`` counts: env steps for learners that act, gradient updates for an
offline learner (as d3rlpy and CORL count them), and a budget that a run keeps to within one
iteration, an evolution strategy's included. Each test failed before its fix."""

import json

import pytest

import shoal
from shoal.cli import main

pytestmark = pytest.mark.extra("offline")


@pytest.fixture(scope="module")
def random_pendulum(tmp_path_factory):
    out = tmp_path_factory.mktemp("data") / "random"
    shoal.collect(out, env="Pendulum-v1", episodes=4, num_envs=2)
    return out


def test_an_offline_run_counts_gradient_updates(random_pendulum, tmp_path, capsys):
    """``bc --total-steps 5000`` made about 20 gradient steps (5,000 transitions at batch
    256) and printed them as env steps."""
    run_dir = tmp_path / "bc"
    code = main(["train", "bc", "--dataset", str(random_pendulum), "--total-steps", "40",
                 "--run-dir", str(run_dir), "--run.eval-every-steps", "20",
                 "--run.eval-episodes", "2", "--replay.batch-size", "16",
                 "--run.no-console"])  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["train/grad_steps"] == 40 and rows[-1]["step"] == 40
    assert [r["step"] for r in rows if "eval/return" in r] == [20, 40]
    assert "run.total_steps 40 reached (40 updates)" in out
    assert "at update 40" in out and "env step" not in out


def test_an_evolution_strategy_keeps_to_its_budget(tmp_path):
    """A generation played rounds of episodes_per_batch episodes whatever the budget: 38,617
    env steps for run.total_steps 15,000 here."""
    result = shoal.train("es", env="CartPole-v1", total_steps=15_000, quiet=True,
                         run_dir=str(tmp_path / "es"),
                         **{"run.eval_every_steps": 0, "episodes_per_batch": 200,
                            "train_batch_size": 2000, "stepsize": 0.05})  # fmt: skip
    assert 15_000 <= result.env_steps <= 16_500
