"""QMIX's, VDN's and IQL's learner group (``run.learners`` = N > 1): N data-parallel copies of
the learner on Ray actors (`shoal.algos.cores.learner_group.ReplayLearnerGroup`), each taking
some of every batch's episodes.

An episode's recurrent unroll, double-Q targets and mixing are its own, so rank r runs the
learner's unchanged ``update`` on its contiguous episodes (`EpisodeShare`). The TD loss is a
mean over the batch's real transitions (and, for IQL, the agents that acted), so each rank's
gradient is weighted by its share of them before the all-reduce: the sum is the whole batch's
gradient, and the ranks take one learner's step (tested on two forked gloo ranks).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from shoal.algos.cores.group_shares import SharedMinimize, share
from shoal.algos.cores.learner_group import ReplayLearnerGroup
from shoal.core.device import to_device
from shoal.data.episode_replay import EpisodeBatch


def episodes_of(batch: EpisodeBatch, episodes: slice) -> EpisodeBatch:
    """``batch`` (time-major, ``[T(+1), B, ...]``; ``indices`` ``[B]``) cut to ``episodes``."""

    def cut(value: Any) -> Any:
        if value is None:
            return None
        return value[episodes] if isinstance(value, np.ndarray) else value[:, episodes]

    return EpisodeBatch(*(cut(v) for v in batch))


class EpisodeShare:
    """How a QMIX rank takes an update: the learner's ``update(batch, inputs)`` on its
    contiguous episodes, through a `SharedMinimize` weighted by its share of the loss's
    transitions (the learner's ``loss_mask``). Returns ``(share, metrics, no priorities)``:
    the episode replay samples uniformly."""

    def __init__(self, learner: Any, rank: int, world_size: int):
        self.learner, self.rank, self.world_size = learner, rank, world_size
        self.minimize = learner.minimize = SharedMinimize(rank, world_size)

    def update(self, args: tuple) -> tuple[float, dict[str, torch.Tensor], torch.Tensor]:
        (batch, inputs), _ = args  # no calls: exploration is the driver's alone
        learner = self.learner
        episodes = share(batch.actions.shape[1], self.rank, self.world_size)
        mask = learner.loss_mask(batch)
        self.minimize.weight = float(mask[:, episodes].sum()) / max(1, int(mask.sum()))
        part = to_device(episodes_of(batch, episodes), learner.device)
        stats = learner.update(part, to_device(inputs[:, episodes], learner.device))
        return self.minimize.weight, to_device(stats, torch.device("cpu")), torch.empty(0)


class QMIXLearnerGroup:
    """``run.learners`` ranks of ``learner_cls(config, *sizes)`` (`shoal.algos.multi_agent.
    qmix.QMIXLearner`), driven as that learner: ``update(batch, inputs)`` returns the whole
    batch's metrics; ``online`` is the synchronized copy's networks (what acting and the
    deployed policy read)."""

    device = torch.device("cpu")
    """Where the batches go from: the host, to the ranks through Ray's object store."""

    def __init__(self, learner_cls: Any, config: Any, *sizes: int):
        self.group = ReplayLearnerGroup(learner_cls, config, *sizes, share_cls=EpisodeShare)

    def update(self, batch: EpisodeBatch, inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        return self.group.update((batch, inputs))[0]

    @property
    def online(self) -> Any:
        """The synchronized copy's `QMIXNetworks`."""
        return self.group.synchronized().online

    @property
    def grad_steps(self) -> int:
        return self.group.grad_steps

    @property
    def restarts(self) -> int:
        return self.group.restarts

    def kill(self, rank: int) -> None:
        """Kill rank ``rank``'s process, as a crash would (for tests of recovery)."""
        self.group.kill(rank)

    def state_dict(self) -> dict[str, Any]:
        return self.group.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.group.load_state_dict(state)

    def close(self) -> None:
        self.group.close()
