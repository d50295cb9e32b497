"""Sampling ahead: a sampler thread collects the next rollouts while the learner trains on
the current one (double-buffered rollouts, as in Sample Factory's and RLlib's asynchronous
PPO), with a fixed policy lag.

Rollout ``n`` (counted from the run's start) acts with exactly the weights the learner
published as version ``max(0, n - max_lag)``: versions count the updates behind a set of
weights, and the learner's update on rollout ``n`` starts from version ``n``. Every rollout
but the first ``max_lag`` is therefore exactly ``max_lag`` updates old when it is learned
from, never older; the thread waits for the version it needs rather than taking whatever is
newest. Which weights act is then a matter of counting, not of timing, so a seeded run
samples the same rollouts however the threads are scheduled (the thread must be the only
user of the generator its sampler draws actions from), and a checkpoint can hold the state
between two iterations exactly: the rollouts sampled ahead and the weight versions that
later rollouts still need (`AheadSampler.get_state`).

The thread steps the wrapped sampler (`LocalSampler` in-process, `RaySampler` with runners
on other processes or nodes); with one torch thread per side, on two cores the learner's
arithmetic and the envs' steps and the acting network run at once.
"""

from __future__ import annotations

import collections
import threading
from typing import Any, NamedTuple

import torch

from shoal.core.types import EpisodeStats, Rollout

Weights = dict[str, torch.Tensor]


class Ahead(NamedTuple):
    """A rollout sampled ahead: its index in the run, the rollout and its finished
    episodes, and the weight version it acted with."""

    index: int  # type: ignore[assignment]  # shadows tuple.index, as a field may
    rollout: Rollout
    episodes: EpisodeStats
    version: int
    restarted: tuple[int, ...] = ()
    """The runners restarted while sampling it (the sampler's ``last_restarted``)."""


class AheadSampler:
    """Samples rollouts in a background thread, each with the weight version its index
    allows (module docstring). ``publish`` hands over the learner's weights after each update
    (copied); ``take`` returns the next rollout, waiting for it; ``stop`` parks the thread once
    it has sampled all that the published versions allow (the wrapped sampler may then be
    read or saved; the next ``take`` starts it again); ``close`` stops it after the rollout
    in flight."""

    def __init__(self, sampler: Any, max_lag: int) -> None:
        if max_lag < 1:
            raise ValueError("AheadSampler samples at least one rollout ahead (max_lag >= 1)")
        self.sampler = sampler
        self.max_lag = max_lag
        self.next_index = 0
        """The index of the next rollout the thread starts."""
        self.snapshots: dict[int, Weights] = {}
        self.ready: collections.deque[Ahead] = collections.deque()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._parking = False  # sample what the published versions allow, then return
        self._closing = False  # return before the next rollout
        self._error: BaseException | None = None

    def version_for(self, index: int) -> int:
        return max(0, index - self.max_lag)

    def publish(self, version: int, weights: Weights) -> None:
        """Keep a copy of ``weights`` as ``version`` (the learner goes on changing its own)."""
        copy = {name: tensor.detach().clone() for name, tensor in weights.items()}
        with self._cond:
            self.snapshots[version] = copy
            self._cond.notify_all()

    def take(self, index: int) -> Ahead:
        """Rollout ``index``, the next in order; re-raises an error of the sampler thread."""
        self._start()
        with self._cond:
            self._cond.wait_for(lambda: bool(self.ready) or self._error is not None)
            if self._error is not None and not self.ready:
                error, self._error = self._error, None
                self._thread = None
                raise error
            item = self.ready.popleft()
        if item.index != index:
            raise RuntimeError(f"AheadSampler: rollout {item.index} arrived, {index} expected")
        return item

    def stop(self) -> None:
        """Sample every rollout the published versions allow, then park the thread: what is
        sampled ahead at a stop depends on the versions published, never on timing, so
        checkpoints taken after a stop are the same in every run. Sampled rollouts are kept."""
        self._join(closing=False)

    def _join(self, closing: bool) -> None:
        thread = self._thread
        if thread is None:
            return
        with self._cond:
            self._parking = True
            self._closing = closing
            self._cond.notify_all()
        thread.join()
        with self._cond:
            self._parking = self._closing = False
            self._thread = None

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="shoal-sampler", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while True:
            with self._cond:
                version = self.version_for(self.next_index)
                self._cond.wait_for(
                    lambda v=version: (  # type: ignore[misc]
                        self._parking or self._closing or v in self.snapshots
                    )
                )
                if self._closing or version not in self.snapshots:
                    return  # closed, or parked with nothing more it may sample
                weights = self.snapshots[version]
                for old in [v for v in self.snapshots if v < version]:
                    del self.snapshots[old]  # no later rollout acts with an older version
                index = self.next_index
            try:
                self.sampler.set_weights(weights)
                rollout, episodes = self.sampler.sample()
                # A local runner's rollout is a view of its storage, which its next rollout
                # overwrites while the learner still trains on this one.
                rollout = Rollout(*(x.clone() if isinstance(x, torch.Tensor) else x
                                    for x in rollout))  # fmt: skip
                restarted = tuple(self.sampler.last_restarted)
            except BaseException as exc:  # handed to the learner's thread by take()
                with self._cond:
                    self._error = exc
                    self._cond.notify_all()
                return
            with self._cond:
                self.ready.append(Ahead(index, rollout, episodes, version, restarted))
                self.next_index = index + 1
                self._cond.notify_all()

    def get_state(self) -> dict[str, Any]:
        """The rollouts sampled ahead and the weight versions later rollouts need (the
        thread is stopped first); with the wrapped sampler's own state, exact."""
        self.stop()
        needed = self.version_for(self.next_index)
        return {
            "next_index": self.next_index,
            "ready": [
                {
                    "index": a.index,
                    "rollout": a.rollout._asdict(),
                    "episodes": a.episodes._asdict(),
                    "version": a.version,
                    "restarted": list(a.restarted),
                }
                for a in self.ready
            ],  # fmt: skip
            "snapshots": {str(v): w for v, w in self.snapshots.items() if v >= needed},
        }

    def set_state(self, state: dict[str, Any]) -> None:
        self.stop()
        self.next_index = int(state["next_index"])
        self.ready = collections.deque(
            Ahead(int(a["index"]), Rollout(**a["rollout"]), EpisodeStats(**a["episodes"]),
                  int(a["version"]), tuple(a.get("restarted", ())))
            for a in state["ready"]
        )  # fmt: skip
        self.snapshots = {int(v): w for v, w in state["snapshots"].items()}

    def start_at(self, index: int) -> None:
        """Start afresh at rollout ``index``, nothing sampled ahead and no version published
        (a run resumed from a checkpoint saved without sampling ahead)."""
        self.set_state({"next_index": index, "ready": [], "snapshots": {}})

    def close(self) -> None:
        """Stop after the rollout in flight, sampling nothing more."""
        self._join(closing=True)
