"""A learner group's ranks as processes forked from the test, not Ray actors.

A learner group (`shoal.algos.cores.learner_group`) needs processes of its own: its ranks
join a torch.distributed process group and all-reduce their gradients. What it asks of Ray is
a pool of such workers called in lockstep, one at a time, killed and rebuilt: `ForkedRay`
answers that slice of `shoal.distributed.ray_workers` (``connect``, ``gpu_share``,
``available_cpus``, ``put``, ``node_ip``, ``WorkerPool``) with the pool of
`shoal.distributed.processes` (``run.learner_processes``) forking its workers from this
process. They start with shoal and torch already imported (an actor imports them, seconds
each), and a killed one dies as a killed actor does: its pipe closes, and the call in flight
fails with `WorkerFailed` naming it. The groups' own logic (the split, the all-reduce, restarts from
the synchronized state, relearning, resumes) then runs as it does on Ray; the tests of
`tests/distributed/test_learner_group.py` and `tests/test_cluster_faults.py` keep it on Ray
itself, and on a cluster losing a node.

`use_forked_learners(monkeypatch)` (the ``forked_learners`` fixture) makes the learner groups
and DD-PPO's ranks built in the test use it.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from shoal.distributed import processes


class ForkedRay:
    """The slice of Ray's worker API (`shoal.distributed.ray_workers`) a learner group uses,
    its workers forked from this process."""

    WorkerPool = functools.partial(processes.WorkerPool, fork=True)
    put = staticmethod(processes.put)
    node_ip = staticmethod(processes.node_ip)
    available_cpus = staticmethod(processes.available_cpus)

    @staticmethod
    def connect(address: str | None = None, num_cpus: int | None = None) -> None:
        assert address is None, "forked workers run on this machine"

    @staticmethod
    def gpu_share(device: str, n: int) -> float:
        assert torch.device(device if device != "auto" else "cpu").type == "cpu"
        return 0.0


def use_forked_learners(monkeypatch: Any) -> None:
    """From here to the end of the test, learner groups and DD-PPO fork their ranks from this
    process."""
    import shoal.algos.cores.rank_group as rank_group
    import shoal.algos.policy_gradient.ddppo as ddppo

    for module in (rank_group, ddppo):
        monkeypatch.setattr(module, "require_ray", lambda: ForkedRay)
