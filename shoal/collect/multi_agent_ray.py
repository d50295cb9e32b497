"""MultiAgentSampler: the `MultiAgentRunner` of MADDPG, QMIX/VDN/IQL and CTEDD as N Ray actors.

Runner ``i`` is built in its actor's process by ``build(i)`` (its env, seeded as the
in-process runner ``i`` would be, and the learner's acting side) with the process's torch
generator seeded ``torch_seeds[i]`` (exploration noise drawn from it). Every `sample` takes one
rollout from each runner, all with the latest weights, and joins them along the env axis: a
`MultiAgentRollout` of ``runners x env.num_envs`` envs, whose env ``i * num_envs + e`` is
runner ``i``'s env ``e``. Sampling is synchronous (the learner waits for every runner), so a
run depends on its seed only.

A runner that dies is rebuilt from its seeds and given the latest weights and acting
settings; its envs begin new episodes, and the steps its old actor took since the last
rollout are lost. `last_restarted` names those runners after a `sample`, so that the learner
cuts their episodes (`shoal.data.replay.ReplayBuffer.cut_episodes`,
`shoal.data.episode_replay.EpisodeBuilder.restart`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from shoal.collect.multi_agent import JointObs, MultiAgentEpisodes, MultiAgentRollout
from shoal.core.seeding import derive_seed
from shoal.core.threads import set_compute_threads
from shoal.distributed import require_ray

RunnerBuild = Callable[[int], Any]
"""``build(i)``: runner ``i`` (a `MultiAgentRunner`), built in the process that steps it; a
picklable callable (a module-level function, or a ``functools.partial`` of one)."""


class RemoteRunner:
    """A `MultiAgentRunner` built inside a Ray actor, with the process's torch generator
    seeded ``torch_seed``."""

    def __init__(self, build: RunnerBuild, index: int, torch_seed: int):
        torch.manual_seed(torch_seed)
        set_compute_threads(1)
        self.runner = build(index)

    def describe(self) -> dict[str, Any]:
        return {"num_envs": self.runner.num_envs}

    def view(self) -> JointObs:
        return self.runner.view

    def sample(self) -> tuple[MultiAgentRollout, Any]:
        """The rollout, and what the acting side kept of it (``acting.drain()``, where it
        has one: CTEDD's states and samples), or None."""
        rollout = self.runner.sample()
        drain = getattr(self.runner.acting, "drain", None)
        return rollout, None if drain is None else drain()

    def set_weights(self, weights: Any) -> None:
        self.runner.set_weights(weights)

    def set_acting(self, name: str, value: Any) -> None:
        setattr(self.runner.acting, name, value)

    def get_state(self) -> dict[str, Any]:
        """The runner's state and its process's torch generator (exploration noise)."""
        return {**self.runner.get_state(), "torch_rng": torch.get_rng_state()}

    def set_state(self, state: dict[str, Any], fallback_seed: int) -> bool:
        if "torch_rng" in state:
            torch.set_rng_state(state["torch_rng"])
        return self.runner.set_state(state, fallback_seed)

    def close(self) -> None:
        self.runner.close()


class MultiAgentSampler:
    """``len(torch_seeds)`` runners on Ray actors (module doc), with the in-process
    runner's members: `sample`, `view`, `set_weights`, `get_state`/`set_state`, `close`.

    Args:
        build: builds runner ``i`` (`RunnerBuild`).
        torch_seeds: runner ``i``'s torch seed.
        address: the Ray cluster (``run.ray_address``); None starts Ray on this machine.
        max_restarts: restarts of dead runners allowed in the run.
    """

    def __init__(
        self,
        build: RunnerBuild,
        torch_seeds: list[int],
        address: str | None = None,
        max_restarts: int = 100,
    ):
        workers = require_ray()  # the module; raises a clear error without Ray
        workers.connect(address, num_cpus=max(os.cpu_count() or 1, len(torch_seeds) + 1))
        self._workers = workers
        self._weights: Any = None
        self._acting: dict[str, Any] = {}
        """Acting settings (`set_acting`), given again to a rebuilt runner."""
        self.drained: tuple[torch.Tensor, ...] | None = None
        """What the runners' acting sides kept of the last `sample` (``acting.drain()``,
        tensors joined in runner order), where they keep something: CTEDD's states and
        samples for its exploration update."""
        self._restarted: set[int] = set()
        self.last_restarted: tuple[int, ...] = ()
        """The runners rebuilt since the `sample` before the last one, up to its end (module
        doc): while weights or settings were sent to them, or during the sample."""
        self.pool = workers.WorkerPool(
            RemoteRunner,
            lambda i: (build, i, torch_seeds[i]),
            len(torch_seeds),
            name="runner",
            max_restarts=max_restarts,
            on_restart=self._restore,
        )
        # Wait for every runner, so that set-up errors surface here.
        self.envs_per_runner = int(self.pool.call_all("describe")[0]["num_envs"])

    @property
    def num_runners(self) -> int:
        return len(self.pool)

    @property
    def num_envs(self) -> int:
        return self.envs_per_runner * self.num_runners

    @property
    def restarts(self) -> int:
        return int(self.pool.restarts)

    @property
    def view(self) -> JointObs:
        """What the agents of every env see before the next step."""
        return concat_views(self.pool.call_all("view"))

    def set_weights(self, weights: Any) -> None:
        """Every runner acts with ``weights`` from the next `sample` on."""
        self._weights = self._workers.put(weights)
        self.pool.call_all("set_weights", self._weights)

    def set_acting(self, name: str, value: Any) -> None:
        """Set attribute ``name`` of every runner's acting side (QMIX's epsilon)."""
        self.pool.call_all("set_acting", name, value)
        self._acting[name] = value

    def _restore(self, i: int) -> None:
        self._restarted.add(i)
        if self._weights is not None:
            self.pool.call_one(i, "set_weights", self._weights)
        for name, value in self._acting.items():
            self.pool.call_one(i, "set_acting", name, value)

    def sample(self) -> MultiAgentRollout:
        """One rollout from every runner, joined along the env axis."""
        parts = self.pool.call_all("sample")
        self.last_restarted = tuple(sorted(self._restarted))
        self._restarted.clear()
        kept = [k for _, k in parts]
        self.drained = None if kept[0] is None else tuple(map(torch.cat, zip(*kept, strict=True)))
        return concat_rollouts([r for r, _ in parts])

    def restarted_envs(self) -> list[int]:
        """The envs of the runners in `last_restarted` (joined env indices)."""
        per = self.envs_per_runner
        return [i * per + e for i in self.last_restarted for e in range(per)]

    def get_state(self) -> dict[str, Any]:
        return {"runners": self.pool.call_all("get_state")}

    def set_state(self, state: dict[str, Any], fallback_seed: int) -> bool:
        """Restore each runner's envs and acting side. A checkpoint of another number of
        runners (or of the in-process runner) begins new episodes instead: returns False."""
        saved = state.get("runners") or []
        restored = True
        for i in range(self.num_runners):
            runner_state = saved[i] if len(saved) == self.num_runners else {"env": None}
            restored &= bool(self.pool.call_one(i, "set_state", runner_state, fallback_seed + i))
        return restored

    def kill_runner(self, i: int) -> None:
        """Kill runner ``i``'s process, as a crash would; the next call rebuilds it."""
        self.pool.kill(i)

    def close(self) -> None:
        self.pool.close()


def _joined(parts: list[Any], axis: int) -> Any:
    """Arrays, dicts of arrays, or Nones joined along ``axis``."""
    first = parts[0]
    if first is None:
        return None
    if isinstance(first, dict):
        return {k: np.concatenate([p[k] for p in parts], axis=axis) for k in first}
    return np.concatenate(parts, axis=axis)


def concat_views(parts: list[JointObs]) -> JointObs:
    """Several runners' pending observations as one ``[B, ...]`` view."""
    return JointObs(*(_joined([getattr(p, f) for p in parts], 0) for f in JointObs._fields))


def concat_rollouts(parts: list[MultiAgentRollout]) -> MultiAgentRollout:
    """Rollouts of equal length joined along the env axis (axis 1 of every array)."""
    if len(parts) == 1:
        return parts[0]
    joined: dict[str, Any] = {}
    for name in MultiAgentRollout._fields:
        values = [getattr(p, name) for p in parts]
        if name == "episodes":
            joined[name] = MultiAgentEpisodes.concat(values)
        else:
            joined[name] = _joined(values, 1)
    return MultiAgentRollout(**joined)


def runners_for(build: RunnerBuild, run: Any) -> MultiAgentSampler:
    """``run.runners`` Ray runners on ``run.ray_address``, runner ``i``'s torch generator
    seeded ``derive_seed(run.seed, "runner-torch", i)`` as the single-agent runners' are."""
    seeds = [derive_seed(run.seed, "runner-torch", i) for i in range(run.runners)]
    return MultiAgentSampler(build, seeds, run.ray_address, run.max_worker_restarts)
