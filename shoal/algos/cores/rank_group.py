"""The ranks of a learner group on Ray (`shoal.algos.cores.learner_group`): `GroupRank`, one
data-parallel copy of a learner in a Ray actor, taking its share of each update as a share
part says (`shoal.algos.cores.group_shares`); `RankGroup`, ``run.learners`` of them in one
placement group and one torch.distributed process group, rebuilt as a whole when one fails.
With ``run.learner_processes`` the ranks are processes on this machine instead, without Ray
(`shoal.distributed.processes`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from collections.abc import Callable
from typing import Any

import torch

from shoal.core.device import to_device
from shoal.core.errors import ConfigError, DistributedError, NaNLossError
from shoal.core.seeding import derive_seed
from shoal.distributed import processes, require_ray
from shoal.distributed.collective import free_port, join, leave

log = logging.getLogger("shoal.distributed")


class GroupRank:
    """One rank of a learner group (a Ray actor): ``make_learner()`` taking its updates as
    ``share_cls`` (`RolloutShare` or `ReplayShare`) says."""

    def __init__(
        self,
        make_learner: Callable[[], Any],
        share_cls: Callable[[Any, int, int], Any],
        rank: int,
        world_size: int,
        seed: int,
        host: str | None = None,
    ):
        torch.manual_seed(seed)  # every rank alike: minibatch orders are drawn equally
        self.rank, self.host = rank, host
        """``host``: where rank 0 waits for the others (None: its Ray node's IP)."""
        self.learner = make_learner()
        self.share = share_cls(self.learner, rank, world_size)

    def address(self) -> tuple[str, int]:
        """Rank 0: this node's IP and a free port for the others to rendezvous at."""
        return self.host or require_ray().node_ip(), free_port()

    def join(self, address: tuple[str, int], world_size: int, own_gpu: bool) -> str:
        return join(address, self.rank, world_size, self.learner.device, own_gpu)

    def update(self, args: tuple) -> Any:
        """The learner's update (`RolloutShare`, `ReplayShare`); a NaN loss comes back as its
        message (raised here, it would read as a failed rank and restart the group)."""
        try:
            return self.share.update(args)
        except NaNLossError as exc:
            return str(exc)

    def state(self) -> dict[str, Any]:
        """Host copies: the learner's state and the generator that orders minibatches."""
        learner = to_device(self.learner.state_dict(), torch.device("cpu"))
        return {"learner": learner, "rng": torch.get_rng_state()}

    def load(self, state: dict[str, Any]) -> None:
        self.learner.load_state_dict(state["learner"])
        torch.set_rng_state(state["rng"])

    def close(self) -> None:
        leave()


class RankGroup:
    """The ranks of a learner group on Ray: ``run.learners`` `GroupRank` actors in one
    placement group, joined in one process group (NCCL between GPUs of their own, gloo
    otherwise), and rebuilt as a whole when one fails (a rank cannot rejoin the process group
    of the others). ``state()`` gives the synchronized state a (re)built group loads."""

    def __init__(
        self,
        learner_cls: Callable[..., Any],
        share_cls: Callable[[Any, int, int], Any],
        config: Any,
        spaces: tuple[Any, ...],
        state: Callable[[], dict[str, Any]],
    ):
        run = config.run
        self.size = n = run.learners
        self.max_restarts = run.max_worker_restarts
        self.restarts = 0
        self.rebuilt = False
        """Rebuilt since the last update: the ranks hold the synchronized state."""
        self.share_cls, self.state = share_cls, state
        # Ray actors, or processes on this machine (`shoal.distributed.processes`)
        rw = self.rw = processes if run.learner_processes else require_ray()
        rw.connect(run.ray_address, num_cpus=max(os.cpu_count() or 1, n + run.runners + 1))
        gpus = rw.gpu_share(run.device, n)
        if 0 < gpus < 1 and not run.share_gpus:
            raise ConfigError(
                f"run.learners = {n} but the Ray cluster has {gpus * n:g} GPU(s): set "
                f"run.share_gpus true to let learners share them (gloo through the host), or "
                f"run.learners <= {int(gpus * n)}"
            )
        self.gpus, self.own_gpu = gpus, gpus >= 1.0
        # Inside an actor Ray's CUDA_VISIBLE_DEVICES makes its GPU (share) "cuda".
        model = dataclasses.replace(config.model, backend="torch")  # gradients through autograd
        rank_run = dataclasses.replace(run, device="cuda" if gpus else "cpu")
        rank_config = dataclasses.replace(config, run=rank_run, model=model)
        self.make_learner = functools.partial(learner_cls, rank_config, *spaces)
        self.host = "127.0.0.1" if run.learner_processes else None
        self.seed = derive_seed(run.seed, "learner-group-init")
        # A learner takes one CPU where the cluster has one to spare (Ray counts them; on a
        # laptop the runners and the driver may have claimed them: then an equal share).
        free = float(rw.available_cpus())
        self.cpus = max(0.01, min(1.0, free / n))
        self.backend = self.start()
        if self.gpus and not self.own_gpu:
            log.warning("the %d learners share the cluster's GPUs (%.2f each)", n, self.gpus)

    def start(self) -> str:
        """Build the ranks in one placement group, join them, load the synchronized state."""
        n = self.size
        self.pool = self.rw.WorkerPool(
            GroupRank,
            lambda r: (self.make_learner, self.share_cls, r, n, self.seed, self.host),
            n,
            name="learner",
            max_restarts=0,  # the group restarts as a whole (`restart`)
            num_cpus=self.cpus,
            num_gpus=self.gpus,
            placement="PACK",
        )
        address = self.pool.call_one(0, "address")
        backend = self.lockstep("join", address, n, self.own_gpu)[0]
        self.lockstep("load", self.rw.put(self.state()))
        return str(backend)

    def restart(self, error: DistributedError) -> None:
        """Rebuild the whole group from the synchronized state, up to
        ``run.max_worker_restarts`` times in a run."""
        self.restarts += 1
        if self.restarts > self.max_restarts:
            raise DistributedError(
                f"{error}; the learner group was restarted {self.max_restarts} times in this "
                "run (run.max_worker_restarts): giving up"
            ) from error
        log.warning("%s; restarting the learner group from its last synchronized state", error)
        self.pool.close()
        self.start()

    def lockstep(self, method: str, *args: Any) -> list[Any]:
        """``method`` on every rank, results in rank order, failing at the first rank that
        fails (`WorkerPool.lockstep`: a `DistributedError` naming it)."""
        return list(self.pool.lockstep(method, *args))

    def updates(self, batch: Any, since: Callable[[], list[Any]] = list) -> list[Any]:
        """Every rank's update on ``batch`` (an object reference), in rank order; a group
        that fails is rebuilt, learns again the batches ``since()`` its synchronized state,
        and takes this update again. A NaN loss comes back as its message."""
        while True:
            try:
                for earlier in since() if self.rebuilt else ():
                    self.lockstep("update", earlier)
                self.rebuilt = False
                return self.lockstep("update", batch)
            except DistributedError as exc:
                self.restart(exc)
                self.rebuilt = True

    def synchronized(self) -> dict[str, Any]:
        """Rank 0's state (learner and generator) on the host."""
        return dict(self.pool.call_one(0, "state"))

    def nodes(self) -> list[str]:
        """The Ray node each rank is placed on, in rank order."""
        return list(self.pool.placement_nodes())

    def kill(self, rank: int) -> None:
        """Kill rank ``rank``'s process, as a crash would (for tests of recovery)."""
        self.pool.kill(rank)

    def close(self) -> None:
        self.pool.close()
