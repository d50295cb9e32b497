"""A replay learner and a learner group on a real multi-node Ray cluster losing a node, a runner
and a learner (run as a script by ``tests/test_cluster_faults.py``, in a process of its own: a
process joins one Ray, and the other tests share a local one). Besides: a run that sets no
cluster address starts a Ray of its own while this cluster runs on the machine.

The cluster is a head without CPUs (it holds no runner) and worker nodes as separate raylets
(`ray.cluster_utils.Cluster`). DQN samples one iteration ahead on 2 runners, both on the first
worker node; a second node joins, the first is removed mid-run (both runners die and are
rebuilt on the second), then a runner is killed. Then PPO trains with a group of two learners
(``run.learners``) twice, on the same seed: undisturbed, and losing the node its learners are
placed on (the group is rebuilt on the other node) and later a learner; both runs must end with
the same weights. Prints one JSON line of what happened."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import ray
import torch
from ray.cluster_utils import Cluster

from shoal.registry import ALGORITHMS


def local_ray_apart(address: str) -> bool:
    """Whether a run without ``run.ray_address``, started while this cluster runs on the
    machine (which Ray finds, as it finds one started with `ray start`), starts a Ray of its
    own instead of failing to join this one."""
    code = ("from shoal.distributed.ray_workers import connect; connect(None, num_cpus=1); "
            "import ray; print(ray.get_runtime_context().gcs_address)")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    lines = done.stdout.strip().splitlines()
    return done.returncode == 0 and bool(lines) and lines[-1] != address


def main() -> int:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    first = cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    report: dict = {"local_ray_apart": local_ray_apart(cluster.address)}
    spec = ALGORITHMS["dqn"]
    config = spec.default_config(**{
        "env.id": "CartPole-v1", "env.num_envs": 2, "rollout_steps": 4,
        "replay.learning_starts": 32, "replay.batch_size": 16, "replay.buffer_size": 2_000,
        "replay.max_lag": 1, "model.hidden": (16,),
        "run.runners": 2, "run.ray_address": cluster.address, "run.seed": 3,
    })  # fmt: skip
    torch.manual_seed(0)
    algo = spec.algorithm_cls(config)
    try:
        for _ in range(4):
            algo.train_iteration()
        cluster.add_node(num_cpus=2)
        cluster.wait_for_nodes()
        cluster.remove_node(first)  # both runners were there
        metrics = [algo.train_iteration() for _ in range(6)]
        report["restarts_after_node_loss"] = algo.sampler.restarts
        algo.sampler.kill_runner(0)
        metrics += [algo.train_iteration() for _ in range(4)]
        report["restarts"] = algo.sampler.restarts
        report["iterations"] = algo.iteration
        report["env_steps"] = algo.env_steps
        report["grad_steps"] = metrics[-1]["train/grad_steps"]
        report["finite_loss"] = bool(np.isfinite(metrics[-1]["loss/td"]))
        report["cut_rows"] = int((~algo.replay.valid[: algo.replay._rows_written]).sum())
        algo.close()
        learner_group(cluster, report)
    finally:
        algo.close()
        ray.shutdown()  # the driver leaves before its head node goes
        cluster.shutdown()
    print(json.dumps(report))
    return 0


def learner_group(cluster: Cluster, report: dict) -> None:
    spec = ALGORITHMS["ppo"]
    config = spec.default_config(**{
        "env.id": "CartPole-v1", "env.num_envs": 4, "num_steps": 16, "minibatch_size": 32,
        "num_epochs": 2, "model.hidden": (16,),
        "run.learners": 2, "run.ray_address": cluster.address, "run.seed": 3,
    })  # fmt: skip
    cluster.add_node(num_cpus=2)  # two worker nodes of 2 CPUs: the group fits on either
    cluster.wait_for_nodes()
    finals = []
    for faults in (False, True):
        torch.manual_seed(0)
        algo = spec.algorithm_cls(config)
        try:
            for i in range(6):
                if faults and i == 2:
                    cluster.remove_node(learners_node(cluster, algo))
                    cluster.add_node(num_cpus=2)
                if faults and i == 4:
                    algo.learner.kill(0)
                metrics = algo.train_iteration()
            finals.append({k: v.clone() for k, v in algo.learner.get_weights().items()})
            if faults:
                report["learner_restarts"] = metrics["perf/learner_restarts"]
        finally:
            algo.close()
    clean, faulted = finals
    report["learner_group_equal"] = all(torch.equal(clean[k], faulted[k]) for k in clean)


def learners_node(cluster: Cluster, algo) -> object:
    """The worker node the learner group's ranks are placed on (PACK: one node)."""
    nodes = set(algo.learner.nodes())
    assert len(nodes) == 1, nodes
    (node_id,) = nodes
    return next(n for n in cluster.list_all_nodes() if n.node_id == node_id)


if __name__ == "__main__":
    sys.exit(main())
