"""AlphaZero's self-play on Ray workers: each worker plays its own games, the learner gathers
them in worker order (a run on Ray is the run with its workers called one after another in
this process), a resumed run continues each worker's games, and a worker that dies is
rebuilt with its seed and the current weights."""

import pytest
from in_process_ray import assert_ray_run_is_the_in_process_run
from state_helpers import assert_states_equal

import shoal
from shoal.algos.planning.alphazero import AlphaZero
from shoal.train.checkpoint import load_checkpoint

pytestmark = pytest.mark.extra("openspiel")

SETTINGS = {"run.console": False, "run.tensorboard": False, "env.num_envs": 3,
            "search.num_simulations": 6, "moves_per_iteration": 3, "min_replay": 8,
            "batch_size": 8, "updates_per_iteration": 1, "eval_every": 0,
            "run.runners": 2}  # fmt: skip


def test_self_play_workers_are_deterministic_and_resume(ray_session, tmp_path, monkeypatch):
    """The run on Ray workers is the run of the stand-in in this process, bit for bit; a run
    stopped halfway (there) and resumed ends in the same state."""
    straight, _ = assert_ray_run_is_the_in_process_run(
        tmp_path, monkeypatch, "alphazero", 72, seed=1, **SETTINGS
    )
    assert straight.env_steps == 72  # 2 workers x 3 games x 3 moves x 4 iterations
    part = shoal.train("alphazero", seed=1, total_steps=36, run_dir=str(tmp_path / "c"),
                       **{**SETTINGS, "run.checkpoint_every_steps": 18})  # fmt: skip
    resumed = shoal.train(resume=part.run_dir, total_steps=72)
    assert_states_equal(
        load_checkpoint(resumed.run_dir).state["algorithm"],
        load_checkpoint(straight.run_dir).state["algorithm"],
    )


def test_a_dead_self_play_worker_is_rebuilt(ray_session):
    config = shoal.api.build_config("alphazero", seed=2, **SETTINGS)
    algo = AlphaZero(config)
    algo.train_iteration()
    algo.players.kill(1)
    algo.train_iteration()
    assert algo.players.restarts >= 1
    assert algo.env_steps == 2 * 18  # the rebuilt worker played its moves
    algo.close()
