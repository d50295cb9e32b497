"""Learner groups whose ranks are processes on this machine (``run.learner_processes``,
`shoal.distributed.processes`): fresh Python processes, no Ray. The group's logic is the one
tests/algos/test_learner_groups.py checks on forked stand-ins for Ray actors; here the
processes are the product's own: they take the same updates (to the bit), a killed one
restarts the group from its synchronized state, and the run ends where the undisturbed one
does."""

import pytest
from learner_group_runs import assert_same, build, run

from shoal.distributed import processes


@pytest.mark.usefixtures("forked_learners")
def test_processes_take_the_updates_of_ray_actors_and_survive_a_killed_learner():
    """PPO with two learners: the group on forked stand-ins of Ray actors, then as the
    product's processes (one undisturbed, one losing rank 1 before the second iteration's
    update): all three end with the same weights."""
    on_ray, _, _ = run(build("ppo"), 3)
    settings = {"run.learner_processes": True}
    clean, clean_metrics, _ = run(build("ppo", **settings), 3)
    assert_same(clean, on_ray)
    assert "perf/learner_restarts" not in clean_metrics
    killed, killed_metrics, _ = run(build("ppo", **settings), 3, kill_at=1)
    assert_same(killed, on_ray)
    assert killed_metrics["perf/learner_restarts"] == 1


def test_a_worker_that_raises_fails_its_call_naming_it():
    pool = processes.WorkerPool(dict, lambda i: (), 2, name="learner")
    try:
        assert pool.lockstep("__len__") == [0, 0]
        with pytest.raises(processes.WorkerFailed, match="learner 0 failed during pop"):
            pool.call_one(0, "pop", "missing")
        pool.kill(1)
        with pytest.raises(processes.WorkerFailed, match="learner 1 failed during __len__"):
            pool.lockstep("__len__")
    finally:
        pool.close()
