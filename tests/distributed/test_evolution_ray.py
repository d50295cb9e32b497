"""The derivative-free learners on Ray workers: two workers give exactly the in-process run
for the same seed (the population is split, the seeds follow each individual), and a worker
that dies is rebuilt and its part of the population sent again."""

import numpy as np
import pytest
from state_helpers import assert_states_equal

import shoal
from shoal.algos.evolution.es import ES
from shoal.train.checkpoint import load_checkpoint

SETTINGS = {"run.console": False, "run.tensorboard": False, "search.noise_size": 100_000,
            "episodes_per_batch": 12, "train_batch_size": 1, "model.hidden": (8,),
            "search.eval_prob": 0.1}  # fmt: skip


@pytest.mark.parametrize("algo", ["es", "ars"])
def test_two_workers_give_the_in_process_result(algo, ray_session, tmp_path):
    settings = SETTINGS if algo == "es" else {
        **{k: v for k, v in SETTINGS.items() if k.startswith(("run.", "search."))},
        "num_rollouts": 6, "rollouts_used": 3,
    }  # fmt: skip
    runs = {}
    for runners in (0, 2):
        runs[runners] = shoal.train(algo, env="CartPole-v1", seed=4, total_steps=3000,
                                    run_dir=str(tmp_path / f"r{runners}"),
                                    **{**settings, "run.runners": runners})  # fmt: skip
    assert runs[0].env_steps == runs[2].env_steps
    local, remote = (load_checkpoint(runs[r].run_dir).state["algorithm"] for r in (0, 2))
    assert_states_equal(remote, local)


def test_a_dead_worker_is_rebuilt_and_its_part_sent_again(ray_session):
    config = shoal.api.build_config("es", env="CartPole-v1", seed=5,
                                    **{**SETTINGS, "run.runners": 2})  # fmt: skip
    algo = ES(config)
    first = algo.train_iteration()
    algo.population.pool.pool.kill(1)
    second = algo.train_iteration()
    assert algo.population.pool.restarts >= 1 and second["perf/worker_restarts"] >= 1
    assert second["episode/count"] == first["episode/count"] == 12  # nothing lost
    assert 0 < second["perf/bytes_per_worker"] < 2_000  # offsets, not parameters
    assert np.isfinite(second["episode/return"])
    algo.close()
