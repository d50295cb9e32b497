"""How a rank of a learner group (`shoal.algos.cores.learner_group`) takes its share of an
update, with no Ray in sight: the cut of a batch (`share`, `rows_of`, `columns_of`) and the
part each kind of learner swaps in to take it.

- `RolloutShare` (PPO, A2C, APPO): the learner's unchanged ``update`` on the whole rollout;
  each minibatch is split inside its gradient step, a `SplitStep`.
- `ReplayShare` (the replay and offline learners): the learner's ``update`` on the rank's
  rows of a replay batch, through its gradient-step part swapped for a `SharedMinimize`.
- `ColumnShare` (IMPALA, ACER): the learner's ``update`` on the rank's env columns of a
  time-major batch, through a `SharedMinimize` weighted by its share of the valid steps.
- `SequenceShare` (R2D2): the learner's ``update`` on the rank's sequences of a batch,
  weighted by its share of their valid steps after the burn-in.

A split that belongs to one algorithm lives beside it: REINFORCE's `PGShare` (the whole
batch's advantages first, `shoal.algos.policy_gradient.pg`) and QMIX's `EpisodeShare`
(episodes, `shoal.algos.multi_agent.qmix_group`).

Every split gives the update one learner takes on the whole batch (to float rounding, tested
for each learner), because the losses are means over the rows and the gradients are summed
over the ranks weighted by their shares (`shoal.distributed.collective.average_gradients`).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from shoal.algos.cores.rollout_batch import RolloutBatch
from shoal.core.device import to_device
from shoal.core.types import Rollout
from shoal.distributed.collective import agree_finite, average_gradients, weighted_sum
from shoal.fast.backend import TorchStep
from shoal.losses.objectives import Objective, standardize
from shoal.optim import minimize


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


def rows_of(batch: Any, rows: slice) -> Any:
    """``batch`` (a NamedTuple of ``[N, ...]`` tensors and arrays, dicts and tuples of them
    for composite observations and actions, None where a field is absent) cut to ``rows``."""
    if isinstance(batch, (torch.Tensor, np.ndarray)):
        return batch[rows]
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(rows_of(v, rows) for v in batch))
    if isinstance(batch, (tuple, list)):
        return type(batch)(rows_of(v, rows) for v in batch)
    if isinstance(batch, dict):
        return {k: rows_of(v, rows) for k, v in batch.items()}
    return batch


def size_of(batch: Any) -> int:
    """The rows of ``batch`` (as `rows_of` takes it): a tensor's or array's first axis, a
    batch's actions', a tuple's or dict's first member's."""
    if isinstance(batch, (torch.Tensor, np.ndarray)):
        return int(batch.shape[0])
    if hasattr(batch, "actions"):
        return size_of(batch.actions)
    if isinstance(batch, dict):
        return size_of(next(iter(batch.values())))
    return size_of(batch[0])


class SharedMinimize:
    """`shoal.optim.minimize` as rank ``rank`` of ``world_size`` takes it on its share of a
    replay batch: the ranks agree the losses are finite, then every gradient of the optimizer
    is replaced by the sum over the ranks weighted by their shares (``weight``, set per batch)
    before it is clipped and applied. The losses are means over the rank's rows, so the sum
    is the gradient of the whole batch's mean loss. A replay learner holds its gradient step
    as the part ``minimize``; a rank swaps this one in."""

    def __init__(self, rank: int, world_size: int):
        self.who = f"learner {rank} of the group"
        self.weight = 1.0 / world_size

    def __call__(
        self,
        losses: dict[str, torch.Tensor],
        optimizer: torch.optim.Optimizer,
        max_grad_norm: float | None = None,
        **kwargs: Any,
    ) -> Any:
        agree_finite(losses, self.who)
        parameters = [p for group in optimizer.param_groups for p in group["params"]]
        return minimize(
            losses,
            optimizer,
            max_grad_norm,
            before_clip=lambda: average_gradients(parameters, self.weight),
            **kwargs,
        )


class WholeBatch:
    """How one learner takes a batch whose means it needs at several points of an update
    (TRPO's gradient, Fisher-vector products and line search): all of it. A learner group's
    rank swaps in `RankRows`."""

    weight = 1.0
    minimize = staticmethod(minimize)

    def rows(self, batch: Any) -> Any:
        return batch

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        """The whole batch's mean, from a mean over the rows `rows` gave: itself."""
        return value


class RankRows:
    """How rank ``rank`` of ``world_size`` takes such a batch: its contiguous rows of every
    batch or minibatch `rows` is given (a NamedTuple of row-major fields, a tensor of
    indices, anything `rows_of` cuts), and the whole's means as sums over the ranks of their
    means weighted by their shares (`shoal.distributed.collective.weighted_sum`); its
    gradient steps go through a `SharedMinimize` weighted so. A batch with fewer rows than
    ranks leaves a rank without rows: it computes on the whole at weight 0, so it still
    joins every collective and adds nothing."""

    def __init__(self, rank: int, world_size: int):
        self.rank, self.world_size = rank, world_size
        self.minimize = SharedMinimize(rank, world_size)
        self.weight = 1.0 / world_size

    def rows(self, batch: Any) -> Any:
        size = size_of(batch)
        rows = share(size, self.rank, self.world_size)
        self.weight = self.minimize.weight = (rows.stop - rows.start) / max(1, size)
        if rows.stop == rows.start:
            rows = slice(0, size)
        return rows_of(batch, rows)

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        return weighted_sum(value, self.weight)


class RolloutShare:
    """How an on-policy rank takes an update: the learner's ``update(*args)`` on the whole
    rollout, each minibatch split by its `SplitStep`."""

    def __init__(self, learner: Any, rank: int, world_size: int):
        self.learner = learner
        learner.step = SplitStep(learner, rank, world_size)

    def update(self, args: tuple) -> Any:
        return self.learner.update(*args)


def batch_rows(batch: Any) -> int:
    """The rows of a replay batch: its sampled indices', or `size_of`'s (AlphaZero's
    positions)."""
    indices = getattr(batch, "indices", None)
    return size_of(batch) if indices is None else len(indices)


def by_rows(learner: Any, batch: Any, rows: slice) -> float:
    """``rows``' share of a replay batch whose losses are means over its rows."""
    return (rows.stop - rows.start) / batch_rows(batch)


def by_valid_steps(learner: Any, batch: Any, rows: slice) -> float:
    """``rows``' share of the valid steps after the burn-in of a batch of sequences (R2D2's
    loss is a mean over them)."""
    valid = batch.fields["valid"][:, learner.config.burn_in :]
    return float(valid[rows].sum()) / max(1, int(valid.sum()))


class ReplayShare:
    """How a replay rank takes an update: first the calls the driver made on its copy since
    (the exploration settings), then the learner's ``update`` on the rank's rows of the batch
    through a `SharedMinimize` weighted by ``weigh(learner, batch, rows)``: `by_rows`, or
    R2D2's `by_valid_steps` (`SequenceShare`: each sequence's burn-in and targets are its own).
    Returns ``(share, metrics, priorities)`` on the host (priorities None from a learner
    that has none)."""

    def __init__(
        self,
        learner: Any,
        rank: int,
        world_size: int,
        weigh: Callable[[Any, Any, slice], float] = by_rows,
        cut: Callable[[Any, slice], Any] = rows_of,
    ):
        self.learner, self.rank, self.world_size, self.weigh = learner, rank, world_size, weigh
        self.cut = cut
        """How a batch is cut to the rank's rows (MuZero's unrolls: `unroll_rows`)."""
        self.minimize = learner.minimize = SharedMinimize(rank, world_size)

    def update(self, args: tuple) -> Any:
        """``(batch, calls)``; a batch of None makes the calls alone and returns the last
        one's result (`shoal.algos.cores.learner_group.ReplayLearnerGroup.call`)."""
        batch, calls = args
        results = [getattr(self.learner, method)(*call_args) for method, call_args in calls]
        host = torch.device("cpu")
        if batch is None:
            return to_device(results[-1], host)
        rows = share(batch_rows(batch), self.rank, self.world_size)
        self.minimize.weight = self.weigh(self.learner, batch, rows)
        stats, priorities = self.learner.update(self.cut(batch, rows))
        if priorities is not None:  # a learner without prioritized replay has none
            priorities = priorities.detach().to(host)
        return self.minimize.weight, to_device(stats, host), priorities


SequenceShare = functools.partial(ReplayShare, weigh=by_valid_steps)
"""R2D2's rank: its rows of a batch of sequences, weighted `by_valid_steps`."""


ENV_MAJOR = ("last_values", "policy_state", "last_obs")
"""A rollout's fields whose axis 0 is the env's; the others are time-major, ``[T, B, ...]``
(as `shoal.collect.ray.concat_rollouts` joins them)."""


def columns_of(rollout: Rollout | dict[str, Any], columns: slice) -> Any:
    """A time-major ``rollout`` cut to the env columns ``columns``; a dict of time-major
    tensors (ACER's segments) likewise."""

    def cut(value: Any, axis: int) -> Any:
        if value is None:
            return None
        if isinstance(value, dict):  # composite observations
            return {k: cut(v, axis) for k, v in value.items()}
        return value[columns] if axis == 0 else value[:, columns]

    if isinstance(rollout, dict):
        return {k: cut(v, 1) for k, v in rollout.items()}
    return type(rollout)(
        *(cut(getattr(rollout, f), 0 if f in ENV_MAJOR else 1) for f in rollout._fields)
    )


class ColumnShare:
    """How an IMPALA (or ACER) rank takes an update: the learner's ``update(rollout, lr)`` on
    its contiguous env columns of the time-major batch (V-trace and Retrace run along each
    column's time axis, so a column's targets are those of the whole batch), through a
    `SharedMinimize` weighted by the rank's share of the valid steps (the losses are means
    over them). Returns ``(share, metrics)``, the metrics on the host."""

    def __init__(self, learner: Any, rank: int, world_size: int):
        self.learner, self.rank, self.world_size = learner, rank, world_size
        self.minimize = learner.minimize = SharedMinimize(rank, world_size)

    def update(self, args: tuple) -> tuple[float, dict[str, Any]]:
        rollout, *rest = args
        valid = rollout["valid"] if isinstance(rollout, dict) else rollout.valid
        columns = share(valid.shape[1], self.rank, self.world_size)
        self.minimize.weight = float(valid[:, columns].sum()) / max(1, int(valid.sum()))
        metrics = self.learner.update(columns_of(rollout, columns), *rest)
        return self.minimize.weight, to_device(metrics, torch.device("cpu"))
