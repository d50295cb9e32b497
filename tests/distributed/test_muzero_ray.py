"""MuZero's self-play on Ray workers: each worker steps its own envs, the learner gathers the
finished episodes in worker order (a run on Ray is the run with its workers called one after
another in this process), a resumed run continues each worker's episodes, and a dead worker
is rebuilt with its seed and the current weights."""

from in_process_ray import assert_ray_run_is_the_in_process_run
from state_helpers import assert_states_equal

import shoal
from shoal.algos.planning.muzero import MuZero
from shoal.train.checkpoint import load_checkpoint

SETTINGS = {"run.console": False, "run.tensorboard": False, "run.eval_every_steps": 0,
            "env.num_envs": 2, "search.num_simulations": 4, "steps_per_iteration": 8,
            "min_replay": 8, "batch_size": 8, "updates_per_iteration": 1,
            "unroll_steps": 2, "n_step": 3, "run.runners": 2}  # fmt: skip


def test_self_play_workers_are_deterministic_and_resume(ray_session, tmp_path, monkeypatch):
    """The run on Ray workers is the run of the stand-in in this process, bit for bit; a run
    stopped halfway (there) and resumed ends in the same state."""
    straight, _ = assert_ray_run_is_the_in_process_run(
        tmp_path, monkeypatch, "muzero", 192, seed=1, env="CartPole-v1", **SETTINGS
    )
    assert straight.env_steps == 192  # 2 workers x 2 envs x 8 steps x 6 iterations
    part = shoal.train("muzero", env="CartPole-v1", seed=1, total_steps=96,
                       run_dir=str(tmp_path / "c"),
                       **{**SETTINGS, "run.checkpoint_every_steps": 64})  # fmt: skip
    resumed = shoal.train(resume=part.run_dir, total_steps=192)
    assert_states_equal(
        load_checkpoint(resumed.run_dir).state["algorithm"],
        load_checkpoint(straight.run_dir).state["algorithm"],
    )


def test_a_dead_self_play_worker_is_rebuilt(ray_session):
    algo = MuZero(shoal.api.build_config("muzero", env="CartPole-v1", seed=2, **SETTINGS))
    algo.train_iteration()
    algo.players.kill(0)
    algo.train_iteration()
    assert algo.players.restarts >= 1 and algo.env_steps == 2 * 32
    algo.close()
