"""RaySampler: the same `EnvRunner` as the local sampler, as N Ray actors.

Runner ``i`` has its own vector envs seeded ``seeds[i]`` and a torch generator seeded
``torch_seeds[i]``, so its data depends on nothing but its seeds and the weights it was given:
one runner samples exactly what a local runner built with the same seeds would. Weights go to
the object store once per broadcast and every runner reads the same copy.

Two ways to sample:

* `sample`: every runner fills one rollout with the latest weights; the rollouts are joined
  along the env axis (``[T, runners * num_envs, ...]``). Synchronous on-policy learners (PPO,
  A2C, ...) use this.
* `stream`: rollouts as each runner finishes one, while the others keep sampling with the
  weights they last received (IMPALA's stale actors).

A runner that dies or raises is restarted from its seeds with the latest weights (see
`shoal.distributed.ray_workers.WorkerPool`); the count is in ``restarts``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from shoal.collect.env_runner import EnvRunner, ModelFn
from shoal.config import EnvConfig
from shoal.core.errors import ConfigError
from shoal.core.interfaces import Weights
from shoal.core.types import EpisodeStats, Rollout, merge_info
from shoal.distributed import require_ray


class RaySampler:
    def __init__(
        self,
        env_config: EnvConfig,
        model_fn: ModelFn,
        num_steps: int,
        seeds: list[int],
        torch_seeds: list[int],
        address: str | None = None,
        max_restarts: int = 100,
        acting: str = "auto",
        compiled: bool = False,
        obs_stats: dict[str, Any] | None = None,
    ):
        """``acting``, ``compiled`` and ``obs_stats`` (frozen normalizer statistics): how
        each runner acts and observes (`EnvRunner`)."""
        running = env_config.normalize_reward or (env_config.normalize_obs and obs_stats is None)
        if running and len(seeds) > 1:
            raise ConfigError(
                "env.normalize_obs / env.normalize_reward: with run.runners > 1 each runner "
                "would normalize with its own statistics; this is not supported yet. Use "
                "run.runners 1, or turn normalization off"
            )
        workers = require_ray()  # the module; raises a clear error without Ray
        workers.connect(address, num_cpus=max(os.cpu_count() or 1, len(seeds) + 1))
        self._workers = workers
        self._weights_ref: Any = None
        self._weight_acks: dict[int, Any] = {}
        """Runner -> result of its last ``set_weights``, checked before its next rollout."""
        self._env_attrs: dict[str, Any] = {}
        """Attributes set with `set_env_attr`, set again on a restarted runner."""
        self._restarted: set[int] = set()
        self.last_restarted: tuple[int, ...] = ()
        """The runners restarted during the last `sample`: their envs began new episodes
        there, and the steps their old actors took after the rollout before were lost (a
        replay cuts those episodes, `shoal.data.replay.ReplayBuffer.cut_episodes`)."""
        self.pool = workers.WorkerPool(
            EnvRunner,
            lambda i: (
                env_config,
                model_fn,
                num_steps,
                seeds[i],
                torch_seeds[i],
                acting,
                compiled,
                None,
                obs_stats,
            ),  # fmt: skip
            len(seeds),
            name="sampler",
            max_restarts=max_restarts,
            on_restart=self._restore,
        )
        # Wait until every runner is up, so that set-up errors surface here and timing
        # starts with all runners sampling.
        spec = self.pool.call_all("describe")[0]
        self.observation_space, self.action_space = spec["observation_space"], spec["action_space"]
        self.envs_per_runner = spec["num_envs"]
        self.agents_per_env = spec["agents_per_env"]
        self.action_masked = spec["action_masked"]

    @property
    def num_runners(self) -> int:
        return len(self.pool)

    @property
    def num_envs(self) -> int:
        return self.envs_per_runner * self.num_runners

    @property
    def restarts(self) -> int:
        return self.pool.restarts

    def set_weights(self, weights: Weights, runners: list[int] | None = None) -> None:
        """Send ``weights`` to ``runners`` (default all); the next samples use them."""
        self._weights_ref = self._workers.put({k: v.detach() for k, v in weights.items()})
        for i in range(self.num_runners) if runners is None else runners:
            self._weight_acks[i] = self.pool.submit(i, "set_weights", self._weights_ref)

    def _check_weights(self, runners: list[int]) -> None:
        """Raise (through a restart) if sending weights to one of ``runners`` failed, so
        that weights a runner cannot load are never silently ignored."""
        for i in runners:
            ack = self._weight_acks.pop(i, None)
            if ack is None:
                continue
            try:
                self._workers.get(ack)
            except self._workers.WORKER_FAILURES as exc:
                self.pool.restart(i, exc)

    def _restore(self, i: int) -> None:
        """A restarted runner gets the latest weights (the old actor's pending ack is moot)."""
        self._restarted.add(i)
        self._weight_acks.pop(i, None)
        if self._weights_ref is not None:
            self.pool.call_one(i, "set_weights", self._weights_ref)
        for name, value in self._env_attrs.items():
            self.pool.call_one(i, "set_env_attr", name, value)

    def set_env_attr(self, name: str, value: Any) -> None:
        """Set attribute ``name`` of every env of every runner to ``value``; a runner that is
        restarted later gets it too."""
        self.pool.call_all("set_env_attr", name, value)
        self._env_attrs[name] = value

    def sample(self) -> tuple[Rollout, EpisodeStats]:
        """One rollout from every runner with the latest weights, joined along the env axis."""
        self._restarted.clear()
        parts = self.pool.call_all("sample")
        self._check_weights(list(range(self.num_runners)))
        self.last_restarted = tuple(sorted(self._restarted))
        return concat_rollouts([r for r, _ in parts]), concat_episodes([e for _, e in parts])

    def stream(
        self, in_flight: int = 1, in_turn: bool = False
    ) -> Iterator[tuple[int, Rollout, EpisodeStats]]:
        """``(runner, rollout, episodes)`` as runners finish; each keeps ``in_flight`` sample
        requests queued, so a rollout can be up to ``in_flight`` broadcasts old. ``in_turn``:
        runner 0, 1, ..., 0, ... instead (`WorkerPool.stream`)."""
        stream = self.pool.stream("sample", in_flight=in_flight, in_turn=in_turn)
        for i, (rollout, episodes) in stream:
            self._check_weights([i])
            yield i, rollout, episodes

    def obs_stats(self) -> dict[str, Any] | None:
        return self.pool.call_one(0, "obs_stats")

    def get_state(self) -> dict[str, Any]:
        return {"runners": self.pool.call_all("get_state")}

    def set_state(self, state: dict[str, Any], fallback_seed: int) -> bool:
        """Restore each runner's envs; a checkpoint from another number of runners restarts
        the episodes instead (returns False)."""
        saved = state["runners"]
        restored = True
        for i in range(self.num_runners):
            runner_state = saved[i] if len(saved) == self.num_runners else {"env": None}
            restored &= self.pool.call_one(i, "set_state", runner_state, fallback_seed + i)
        return restored

    def kill_runner(self, i: int) -> None:
        """Kill runner ``i``'s process, as a crash would; the next call restarts it."""
        self.pool.kill(i)

    def close(self) -> None:
        self.pool.close()


def concat_rollouts(parts: list[Rollout]) -> Rollout:
    """Join rollouts of equal length along the env axis (axis 1; axis 0 of ``last_values``,
    ``last_obs`` and a recurrent ``policy_state``)."""
    if len(parts) == 1:
        return parts[0]
    joined: dict[str, Any] = {}
    for name in Rollout._fields:
        values = [getattr(p, name) for p in parts]
        if values[0] is None:
            joined[name] = None
        elif name in ("last_values", "policy_state", "last_obs"):
            joined[name] = torch.cat(values, dim=0)
        else:
            joined[name] = torch.cat(values, dim=1)
    return Rollout(**joined)


def concat_episodes(parts: list[EpisodeStats]) -> EpisodeStats:
    if len(parts) == 1:
        return parts[0]
    agents = [p.agents for p in parts]
    return EpisodeStats(
        np.concatenate([p.returns for p in parts]),
        np.concatenate([p.lengths for p in parts]),
        None if agents[0] is None else np.concatenate(agents),  # type: ignore[arg-type]
        parts[0].agent_names,
        merge_info([p.info for p in parts]),
    )
