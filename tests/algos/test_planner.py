"""Planning with the true model through env snapshots: it balances CartPole where a random
policy falls, resumes exactly, and refuses envs it cannot snapshot."""

import pytest
from state_helpers import assert_states_equal, metric_rows

import shoal
from shoal.core.errors import ConfigError, ShoalError
from shoal.train.checkpoint import load_checkpoint

SMALL = {"env.num_envs": 2, "search.num_simulations": 12, "rollout_steps": 10,
         "run.console": False}  # fmt: skip


def test_planning_balances_cartpole_where_random_play_falls(tmp_path):
    """60 steps of 2 envs, 25 simulations each: no episode ends (random play lasts about 22
    steps), and the search's root values are those of a pole still up."""
    from shoal.algos.planning.planner import Planner, PlannerConfig
    from shoal.config import replace

    planner = Planner(replace(PlannerConfig(), **{"env.id": "CartPole-v1", "env.num_envs": 2,
                                                  "search.num_simulations": 25}))  # fmt: skip
    for _ in range(60):
        metrics = planner.train_iteration()
        assert "episode/return" not in metrics
    assert planner.returns == [60.0, 60.0]
    assert metrics["search/root_value"] > 5.0  # 20 random steps worth of reward ahead
    planner.close()


def test_resume_is_exact(tmp_path):
    settings = {**SMALL, "run.checkpoint_every_steps": 10}
    part = shoal.train("mcts", env="CartPole-v1", seed=1, total_steps=20,
                       run_dir=str(tmp_path / "a"), **settings)  # fmt: skip
    resumed = shoal.train(resume=part.run_dir, total_steps=40)
    straight = shoal.train("mcts", env="CartPole-v1", seed=1, total_steps=40,
                           run_dir=str(tmp_path / "b"), **settings)  # fmt: skip
    assert resumed.env_steps == straight.env_steps == 40
    got, want = load_checkpoint(resumed.run_dir).state, load_checkpoint(straight.run_dir).state
    assert_states_equal(got["algorithm"], want["algorithm"])
    assert metric_rows(tmp_path / "a") == metric_rows(tmp_path / "b")
    with pytest.raises(ShoalError, match="no policy to load"):
        shoal.load(resumed.run_dir)


@pytest.mark.extra("atari")
def test_envs_that_cannot_be_snapshotted_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="cannot be planned in .* native simulator"):
        shoal.train("mcts", env="ALE/Pong-v5", run_dir=str(tmp_path / "r"), **SMALL)
    with pytest.raises(ConfigError, match="discrete actions"):
        shoal.train("mcts", env="Pendulum-v1", run_dir=str(tmp_path / "r"), **SMALL)
    with pytest.raises(ConfigError, match="eval_every_steps"):
        shoal.train("mcts", env="CartPole-v1", run_dir=str(tmp_path / "r"),
                    **{**SMALL, "run.eval_every_steps": 100})  # fmt: skip
