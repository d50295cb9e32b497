"""Learner groups (``run.learners`` = N > 1): N data-parallel copies of an algorithm's learner
in Ray actors, whose every gradient step is one update on the whole minibatch.

Each rank holds the same learner, built by the algorithm's own class, with one part swapped:
its gradient step is a `SplitStep`. The driver puts the batch in Ray's object store once and
every rank runs the learner's unchanged ``update`` on it: the same minibatches in the same
order (the ranks' generators start equal and draw equally), of which each rank backpropagates
its own contiguous share. The gradients are then summed over the ranks, each weighted by its
share of the minibatch, in one all-reduce (`shoal.distributed.collective`: NCCL between
GPUs, gloo on CPUs); the losses are means over the minibatch, so the sum is the gradient of
the whole minibatch's loss, which is then clipped and applied on every rank alike. Advantages
are standardized over the whole minibatch before it is split, as one learner does.

The driver keeps a synchronized copy, `LearnerGroup.local`, of rank 0's learner after every
update: the weights the samplers get, what checkpoints hold, and where a group whose learner
died starts again. A failed rank (killed process, lost node) ends the update on every rank;
the group is rebuilt (a fresh placement group), loads the copy's weights, optimizer state and
generator state, and runs the same update again, so the run goes on as if nothing had
happened, up to ``run.max_worker_restarts`` times.

DD-PPO (`shoal.algos.policy_gradient.ddppo`) is the decentralized variant: its ranks sample
as well.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import logging
import os
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import torch

from shoal.algos.cores.rollout_batch import RolloutBatch
from shoal.core.device import to_device
from shoal.core.errors import ConfigError, DistributedError, NaNLossError
from shoal.core.seeding import derive_seed
from shoal.distributed import require_ray
from shoal.distributed.collective import agree_finite, average_gradients, free_port, join, leave
from shoal.fast.backend import TorchStep
from shoal.losses.objectives import Objective, standardize

log = logging.getLogger("shoal.distributed")


def share(size: int, rank: int, world_size: int) -> slice:
    """Rank ``rank``'s contiguous share of ``size`` rows: sizes differ by at most one."""
    return slice(size * rank // world_size, size * (rank + 1) // world_size)


class SplitStep:
    """A learner's gradient step as rank ``rank`` of ``world_size`` takes it: on its share of
    the minibatch, the ranks agreeing that the losses are finite, the gradients summed over
    the ranks weighted by their shares (then clipped and applied, as `TorchStep` does).

    Returns this rank's losses and diagnostics (means over its share); the driver averages
    the ranks' metrics."""

    def __init__(self, learner: Any, rank: int, world_size: int):
        self.rank, self.world_size = rank, world_size
        self.weight = 1.0 / world_size
        who = f"learner {rank} of the group"
        self.step = TorchStep(
            learner.model,
            learner.scaler,
            before_minimize=lambda losses: agree_finite(losses, who),
            before_clip=lambda: average_gradients(learner.parameters, self.weight),
        )

    def __call__(
        self,
        objective: Objective,
        batch: RolloutBatch,
        optimizer: torch.optim.Optimizer,
        max_grad_norm: float | None,
        outputs: tuple | None = None,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        if outputs is not None:
            raise ValueError("a learner group splits feed-forward minibatches only")
        if objective.normalize_advantages:  # over the whole minibatch, as one learner does
            batch = batch._replace(advantages=standardize(batch.advantages))
            objective = copy.copy(objective)
            objective.normalize_advantages = False
        size = batch.obs.shape[0]
        rows = share(size, self.rank, self.world_size)
        self.weight = (rows.stop - rows.start) / size
        return self.step(objective, batch.map(lambda x: x[rows]), optimizer, max_grad_norm)


class GroupRank:
    """One rank of a learner group (a Ray actor): ``make_learner()`` with a `SplitStep`."""

    def __init__(self, make_learner: Callable[[], Any], rank: int, world_size: int, seed: int):
        torch.manual_seed(seed)  # every rank alike: minibatch orders are drawn equally
        self.rank = rank
        self.learner = make_learner()
        self.learner.step = SplitStep(self.learner, rank, world_size)

    def address(self) -> tuple[str, int]:
        """Rank 0: this node's IP and a free port for the others to rendezvous at."""
        return require_ray().node_ip(), free_port()

    def join(self, address: tuple[str, int], world_size: int, own_gpu: bool) -> str:
        return join(address, self.rank, world_size, self.learner.device, own_gpu)

    def update(self, args: tuple) -> dict[str, float] | str:
        """The learner's ``update(*args)``; a NaN loss comes back as its message (raised
        here, it would read as a failed rank and restart the group)."""
        try:
            return self.learner.update(*args)
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


class LearnerGroup:
    """``run.learners`` ranks of ``learner_cls(config, obs_space, action_space)``, driven as one
    learner: ``update(*args)`` runs the learner's ``update(*args)`` on every rank and returns
    their averaged metrics; ``model``, ``get_weights`` and the checkpoint state are those of
    the synchronized copy `local`. See the module docstring."""

    def __init__(
        self,
        learner_cls: Callable[[Any, gym.Space, gym.Space], Any],
        config: Any,
        obs_space: gym.Space,
        action_space: gym.Space,
    ):
        run = config.run
        self.size = n = run.learners
        self.max_restarts = run.max_worker_restarts
        self.restarts = 0
        self.local = learner_cls(config, obs_space, action_space)
        self.model = self.local.model
        self.rng = torch.Generator().manual_seed(derive_seed(run.seed, "learner-group")).get_state()
        rw = self._rw = require_ray()
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
        self._make_learner = functools.partial(learner_cls, rank_config, obs_space, action_space)
        self._seed = derive_seed(run.seed, "learner-group-init")
        # A learner takes one CPU where the cluster has one to spare (Ray counts them; on a
        # laptop the runners and the driver may have claimed them: then an equal share).
        free = float(rw.available_cpus())
        self.cpus = max(0.01, min(1.0, free / n))
        self.backend = self._start()
        if self.gpus and not self.own_gpu:
            log.warning("the %d learners share the cluster's GPUs (%.2f each)", n, self.gpus)

    def _start(self) -> str:
        """Build the ranks in one placement group, join them, load the synchronized state."""
        n = self.size
        self.pool = self._rw.WorkerPool(
            GroupRank,
            lambda r: (self._make_learner, r, n, self._seed),
            n,
            name="learner",
            max_restarts=0,  # the group restarts as a whole (`update`)
            num_cpus=self.cpus,
            num_gpus=self.gpus,
            placement="PACK",
        )
        address = self.pool.call_one(0, "address")
        backend = self._lockstep("join", address, n, self.own_gpu)[0]
        self._lockstep("load", self._rw.put(self._state()))
        return str(backend)

    def _state(self) -> dict[str, Any]:
        return {"learner": self.local.state_dict(), "rng": self.rng}

    def update(self, *args: Any) -> dict[str, float]:
        """The learner's ``update(*args)`` on every rank at once; their metrics averaged."""
        batch = self._rw.put(args)
        while True:
            try:
                results = self._lockstep("update", batch)
                break
            except DistributedError as exc:
                self._restart(exc)
        errors = [r for r in results if isinstance(r, str)]
        if errors:
            raise NaNLossError(next((e for e in errors if "loss/" in e), errors[0]))
        state = self.pool.call_one(0, "state")
        self.local.load_state_dict(state["learner"])
        self.rng = state["rng"]
        metrics = {k: sum(r[k] for r in results) / len(results) for k in results[0]}
        if self.restarts:
            metrics["perf/learner_restarts"] = self.restarts
        return metrics

    def _restart(self, error: DistributedError) -> None:
        """Rebuild the whole group from the synchronized copy (a rank cannot rejoin the
        process group of the others)."""
        self.restarts += 1
        if self.restarts > self.max_restarts:
            raise DistributedError(
                f"{error}; the learner group was restarted {self.max_restarts} times in this "
                "run (run.max_worker_restarts): giving up"
            ) from error
        log.warning("%s; restarting the learner group from its last synchronized state", error)
        self.pool.close()
        self._start()

    def _lockstep(self, method: str, *args: Any) -> list[Any]:
        """``method`` on every rank, results in rank order, failing at the first rank that
        fails (`WorkerPool.lockstep`: a `DistributedError` naming it)."""
        return list(self.pool.lockstep(method, *args))

    def nodes(self) -> list[str]:
        """The Ray node each rank is placed on, in rank order."""
        return self.pool.placement_nodes()

    def kill(self, rank: int) -> None:
        """Kill rank ``rank``'s process, as a crash would (for tests of recovery)."""
        self.pool.kill(rank)

    def get_weights(self) -> dict[str, torch.Tensor]:
        return self.local.get_weights()

    def state_dict(self) -> dict[str, Any]:
        """The synchronized copy's state (the learner's own layout), with the ranks' generator."""
        return {**self.local.state_dict(), "group_rng": self.rng}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Into the copy and every rank; a checkpoint of one learner starts the generator
        from the run's seed."""
        self.local.load_state_dict(state)
        if "group_rng" in state:
            self.rng = state["group_rng"]
        self._lockstep("load", self._rw.put(self._state()))

    def close(self) -> None:
        self.pool.close()
