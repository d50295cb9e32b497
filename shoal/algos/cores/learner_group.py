"""Learner groups (``run.learners`` = N > 1): N data-parallel copies of an algorithm's learner
in Ray actors, whose every gradient step is one update on the whole minibatch.

Each rank holds the same learner, built by the algorithm's own class, with one part swapped
(`shoal.algos.cores.group_shares`): its gradient step is a `SplitStep`. The driver puts the
batch in Ray's object store once and every rank runs the learner's unchanged ``update`` on it:
the same minibatches in the same order (the ranks' generators start equal and draw equally), of
which each rank backpropagates its own contiguous share. The gradients are then summed over the
ranks, each weighted by its share of the minibatch, in one all-reduce
(`shoal.distributed.collective`: NCCL between GPUs, gloo on CPUs); the losses are means over
the minibatch, so the sum is the gradient of the whole minibatch's loss, which is then clipped
and applied on every rank alike. Advantages are standardized over the whole minibatch before it
is split, as one learner does.

The driver keeps a synchronized copy, `LearnerGroup.local`, of rank 0's learner after every
update: the weights the samplers get, what checkpoints hold, and where a group whose learner
died starts again. A failed rank (killed process, lost node) ends the update on every rank;
the group is rebuilt (a fresh placement group), loads the copy's weights, optimizer state and
generator state, and runs the same update again, so the run goes on as if nothing had
happened, up to ``run.max_worker_restarts`` times.

A replay learner's group (`ReplayLearnerGroup`: DQN and its variants, DDPG, TD3, SAC, D4PG,
and the offline learners) splits each replay batch instead: rank r updates on its
contiguous rows with the learner's unchanged ``update``, whose gradient step (the learner's
``minimize`` part) is a `SharedMinimize`: the same all-reduce, weighted by the rank's share.
The new priorities come back in the batch's order and the metrics as means over the whole
batch. A replay learner takes many small updates per iteration, so its copy is synchronized
lazily: when the weights or the checkpoint state are asked for, and at least every
`SYNC_EVERY` updates; a rank lost in between is rebuilt from the last synchronized state and
the batches since (kept in Ray's object store) are learned again, which, the updates being
deterministic, ends where the lost group would have.

DD-PPO (`shoal.algos.policy_gradient.ddppo`) is the decentralized variant: its ranks sample
as well.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import torch

from shoal.algos.cores.group_shares import ReplayShare, RolloutShare
from shoal.algos.cores.rank_group import RankGroup
from shoal.core.errors import NaNLossError
from shoal.core.seeding import derive_seed


class LearnerGroup:
    """``run.learners`` ranks of ``learner_cls(config, obs_space, action_space)``, driven as one
    learner: ``update(*args)`` runs the learner's ``update(*args)`` on every rank (as
    ``share_cls`` splits it: `RolloutShare`, IMPALA's `ColumnShare`) and returns their
    averaged metrics; ``model``, ``get_weights`` and the checkpoint state are those of
    the synchronized copy `local`, synchronized after every update. See the module docstring."""

    def __init__(
        self,
        learner_cls: Callable[[Any, gym.Space, gym.Space], Any],
        config: Any,
        obs_space: gym.Space,
        action_space: gym.Space,
        share_cls: Callable[[Any, int, int], Any] = RolloutShare,
    ):
        self.local = learner_cls(config, obs_space, action_space)
        self.model = self.local.model
        self.rng = group_rng(config.run.seed)
        spaces = (obs_space, action_space)
        self.ranks = RankGroup(learner_cls, share_cls, config, spaces, self._state)

    def _state(self) -> dict[str, Any]:
        return {"learner": self.local.state_dict(), "rng": self.rng}

    @property
    def device(self) -> torch.device:
        """Where the synchronized copy computes (APPO's V-trace re-evaluation)."""
        return torch.device(self.local.device)

    def update(self, *args: Any) -> dict[str, float]:
        """The learner's ``update(*args)`` on every rank at once; their metrics averaged."""
        results = self.ranks.updates(self.ranks.rw.put(args))
        raise_nan_losses(results)
        state = self.ranks.synchronized()
        self.local.load_state_dict(state["learner"])
        self.rng = state["rng"]
        if isinstance(results[0], tuple):  # (share, metrics): means over the rank's share
            metrics = {k: sum(w * r[k] for w, r in results) for k in results[0][1]}
        else:
            metrics = {k: sum(r[k] for r in results) / len(results) for k in results[0]}
        if self.ranks.restarts:
            metrics["perf/learner_restarts"] = self.ranks.restarts
        return metrics

    def nodes(self) -> list[str]:
        """The Ray node each rank is placed on, in rank order."""
        return self.ranks.nodes()

    def kill(self, rank: int) -> None:
        """Kill rank ``rank``'s process, as a crash would (for tests of recovery)."""
        self.ranks.kill(rank)

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
        self.ranks.lockstep("load", self.ranks.rw.put(self._state()))

    def close(self) -> None:
        self.ranks.close()


def raise_nan_losses(results: list[Any]) -> None:
    """Raise the `NaNLossError` a rank reported instead of its result (the one naming a loss
    first)."""
    errors = [r for r in results if isinstance(r, str)]
    if errors:
        raise NaNLossError(next((e for e in errors if "loss/" in e), errors[0]))


def group_rng(seed: int) -> torch.Tensor:
    """The state the ranks' torch generator starts from in a run seeded ``seed``."""
    return torch.Generator().manual_seed(derive_seed(seed, "learner-group")).get_state()


SYNC_EVERY = 32
"""A replay learner group's copy is synchronized at least every this many updates: a rebuilt
group learns again at most this many batches, which Ray's object store keeps until then."""


class ReplayLearnerGroup:
    """``run.learners`` ranks of a replay learner (``learner_cls(config, obs_space,
    action_space)``: DQN's, DDPG's, TD3's, SAC's, D4PG's, the offline learners'), driven as one
    `ReplayLearner` (R2D2's too, its batches of sequences split by `SequenceShare`):
    ``update(batch)`` splits the batch among the ranks (`ReplayShare`) and returns the whole
    batch's metrics and new priorities, in the batch's order. The batches go to the ranks
    through Ray's object store from host memory (the replay stays on the CPU). The copy `local`
    is synchronized lazily (see the module docstring); the exploration settings the algorithm
    makes on it reach the ranks with the next batch."""

    device = torch.device("cpu")
    """Where the replay keeps its batches: they leave for the ranks through the host."""

    def __init__(
        self,
        learner_cls: Callable[..., Any],
        config: Any,
        *spaces: Any,
        share_cls: Callable[[Any, int, int], Any] = ReplayShare,
    ):
        """``spaces``: what ``learner_cls`` takes after the config (``obs_space,
        action_space``; QMIX's learner its input and action sizes)."""
        self.local = learner_cls(config, *spaces)
        self.rng = group_rng(config.run.seed)
        self.grad_steps = self.local.grad_steps
        self.calls: list[tuple[str, tuple]] = []
        """Calls made on the copy since the last batch left: the ranks make them first."""
        self.backlog: list[Any] = []
        """The batches (object references) learned since the copy was synchronized."""
        self.ranks = RankGroup(learner_cls, share_cls, config, spaces, self._state)

    def _state(self) -> dict[str, Any]:
        return {"learner": self.local.state_dict(), "rng": self.rng}

    def update(self, batch: Any) -> tuple[dict[str, torch.Tensor], Any]:
        """One update of the group on ``batch``: the metrics (means over the batch) and the
        new priorities ``[N]`` (None from a learner that has none: AlphaZero's)."""
        ref = self.ranks.rw.put((batch, self.calls))
        self.calls = []
        results = self.ranks.updates(ref, since=lambda: list(self.backlog))
        raise_nan_losses(results)
        self.backlog.append(ref)
        self.grad_steps += 1
        stats = {k: sum(w * r[k] for w, r, _ in results) for k in results[0][1]}
        parts = [p for _, _, p in results]
        priorities = None if parts[0] is None else torch.cat(parts)
        if len(self.backlog) >= SYNC_EVERY:
            self._synchronize()
        return stats, priorities

    def call(self, method: str, *args: Any) -> Any:
        """``method(*args)`` of the learner on every rank now, on the same arguments, and rank
        0's result: a step each rank takes alike, whole (CTEDD's exploration update, small and
        normalized over all its samples), so the ranks stay equal without an all-reduce. The
        copy takes it at the next synchronization; a rebuilt group makes the call again with
        the batches since."""
        ref = self.ranks.rw.put((None, [*self.calls, (method, args)]))
        self.calls = []
        results = self.ranks.updates(ref, since=lambda: list(self.backlog))
        raise_nan_losses(results)
        self.backlog.append(ref)
        return results[0]

    def synchronized(self) -> Any:
        """The copy `local`, synchronized with the ranks (the learner an algorithm reads its
        networks from)."""
        self._synchronize()
        return self.local

    def _synchronize(self) -> None:
        """The copy takes rank 0's state; the calls not yet sent are made on it again."""
        if not self.backlog:
            return
        state = self.ranks.synchronized()
        self.local.load_state_dict(state["learner"])
        self.rng = state["rng"]
        self.backlog.clear()
        for method, args in self.calls:
            getattr(self.local, method)(*args)

    def _call(self, method: str, *args: Any) -> None:
        getattr(self.local, method)(*args)
        self.calls.append((method, args))

    def set_exploration(self, *args: float) -> None:
        """DQN's (and R2D2's) exploration, on the copy and, with the next batch, the ranks."""
        self._call("set_exploration", *args)

    def set_lr(self, lr: float) -> None:
        """A learning-rate schedule's value (AlphaZero's, MuZero's), on the copy and, with
        the next batch, the ranks."""
        self._call("set_lr", lr)

    def set_random_actions(self, on: bool) -> None:
        """The actor-critics' random-action switch, on the copy and on the ranks."""
        self._call("set_random_actions", on)

    @property
    def policy_network(self) -> torch.nn.Module:
        self._synchronize()
        return self.local.policy_network

    @property
    def model(self) -> torch.nn.Module:
        """The copy's network (R2D2's, read by `OnPolicyCore`), synchronized."""
        self._synchronize()
        return self.local.model

    def get_weights(self) -> dict[str, torch.Tensor]:
        self._synchronize()
        return self.local.get_weights()

    @property
    def restarts(self) -> int:
        """How often the group was rebuilt in this run (``perf/learner_restarts``)."""
        return self.ranks.restarts

    def nodes(self) -> list[str]:
        """The Ray node each rank is placed on, in rank order."""
        return self.ranks.nodes()

    def kill(self, rank: int) -> None:
        """Kill rank ``rank``'s process, as a crash would (for tests of recovery)."""
        self.ranks.kill(rank)

    def state_dict(self) -> dict[str, Any]:
        """The synchronized copy's state (the learner's own layout), with the ranks' generator."""
        self._synchronize()
        return {**self.local.state_dict(), "group_rng": self.rng}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Into the copy and every rank; a checkpoint of one learner starts the generator
        from the run's seed."""
        self.local.load_state_dict(state)
        if "group_rng" in state:
            self.rng = state["group_rng"]
        self.grad_steps = self.local.grad_steps
        self.backlog.clear()
        self.calls = []
        self.ranks.lockstep("load", self.ranks.rw.put(self._state()))

    def close(self) -> None:
        self.ranks.close()
