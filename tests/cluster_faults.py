"""A replay learner on a real multi-node Ray cluster losing a node and a runner (run as a script
by ``tests/test_cluster_faults.py``, in a process of its own: a process joins one
Ray, and the other tests share a local one).

The cluster is a head without CPUs (it holds no runner) and worker nodes as separate raylets
(`ray.cluster_utils.Cluster`). DQN samples one iteration ahead on 2 runners, both on the first
worker node; a second node joins, the first is removed mid-run (both runners die and are
rebuilt on the second), then a runner is killed. Prints one JSON line of what happened."""

from __future__ import annotations

import json
import sys

import numpy as np
import ray
import torch
from ray.cluster_utils import Cluster

from shoal.registry import ALGORITHMS


def main() -> int:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    first = cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    spec = ALGORITHMS["dqn"]
    config = spec.default_config(**{
        "env.id": "CartPole-v1", "env.num_envs": 2, "rollout_steps": 4,
        "replay.learning_starts": 32, "replay.batch_size": 16, "replay.buffer_size": 2_000,
        "replay.max_lag": 1, "model.hidden": (16,),
        "run.runners": 2, "run.ray_address": cluster.address, "run.seed": 3,
    })  # fmt: skip
    torch.manual_seed(0)
    algo = spec.algorithm_cls(config)
    report: dict = {}
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
    finally:
        algo.close()
        ray.shutdown()  # the driver leaves before its head node goes
        cluster.shutdown()
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
