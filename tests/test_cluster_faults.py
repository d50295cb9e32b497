"""Faults on a real multi-node Ray cluster (a head and worker nodes as separate raylets, started
on this machine by `ray.cluster_utils.Cluster`): a replay learner sampling ahead on two
runners loses the node they run on, gains another and loses a runner, and finishes with
nothing lost; a learner group loses the node its learners are on, then a learner, and ends
with the weights of an undisturbed run. The cluster lives in a process of its own
(``tests/cluster_faults.py``), so this test needs not the session's local Ray and runs beside
the Ray group, not in it."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="needs pip install 'shoal[ray]'")

HELPER = Path(__file__).parent / "cluster_faults.py"


def test_a_lost_node_a_killed_runner_and_a_killed_learner_lose_nothing():
    done = subprocess.run(
        [sys.executable, str(HELPER)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    # With the cluster up (Ray finds it, as one started with `ray start`), a run without
    # run.ray_address started a local Ray of its own instead of failing to join it.
    assert report["local_ray_apart"], report
    # Both runners died with their node and were rebuilt on the new one; then one more.
    assert report["restarts_after_node_loss"] == 2, report
    assert report["restarts"] == 3, report
    # Every iteration stored its 2 runners x 2 envs x 4 steps and learned from them.
    assert report["iterations"] == 14 and report["env_steps"] == 14 * 16, report
    assert report["grad_steps"] == 2 * (14 - 2) and report["finite_loss"], report
    # The episodes the lost runners were in were cut in the replay: one row per env of
    # each restarted runner (2 + 2 + 2 envs), besides CartPole's own autoreset rows.
    assert report["cut_rows"] >= 6, report
    # The learner group was rebuilt twice (a lost node, a killed learner) from its last
    # synchronized state, and ended where the undisturbed run did.
    assert report["learner_restarts"] == 2, report
    assert report["learner_group_equal"], report
