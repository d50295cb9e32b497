"""Ape-X: distributed prioritized experience replay (Horgan et al. 2018, arXiv:1803.00933),
with DQN and DDPG (Ape-X DPG) learners, and R2D2's distributed form (Kapturowski et al.
2019): recurrent actors sending sequences to sequence shards.

``run.runners`` actors (Ray actors) each step their own vector env with a copy of the policy
and their own exploration rate, cut their steps into n-step transitions, score them with their
own network copy (the initial priorities) and send them to ``replay_shards`` prioritized
replay shards (`shoal.data.replay_shard`). The learner, in the driver process, trains on
batches from whichever shard answers first while further requests stay queued (so the next
batches are on their way while it trains), sends the new priorities back to the batch's
shard, and pushes its weights to the actors every ``weight_sync_every`` steps. The learners,
networks, losses and exploration noise are DQN's and DDPG's own (`shoal.algos.value.dqn`,
`shoal.algos.continuous.ddpg`). ``training_intensity`` (not in the paper, whose learner had a GPU to
itself) holds the ratio of replayed transitions to env steps where actors and learner share
a few cores. With ``run.learners`` N > 1 the learner is a group of N data-parallel copies
on Ray actors (`shoal.algos.cores.learner_group.ReplayLearnerGroup`), each taking its rows (or
sequences) of every batch the shards send.

Ray is reached only through `shoal.distributed`. A killed actor restarts with its seeds and
gets the latest weights; a killed shard restarts empty. The seed fixes every actor's env and
torch seeds, but how actors and learner interleave depends on timing: two runs of one seed
are alike, not bit-identical, unless ``results_in_turn`` takes results in request order.

The configs, and which learner each trains, are in `shoal.algos.value.apex_config`.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np
import torch

from shoal.algos.cores.group_shares import ReplayShare, SequenceShare
from shoal.algos.cores.learner_group import ReplayLearnerGroup
from shoal.algos.spec import AlgorithmSpec
from shoal.algos.value.apex_actor import (
    ApexActor,
    Variant,
    ddpg_priorities,
    dqn_priorities,
    exploration_scales,
    per_worker_epsilons,
)
from shoal.algos.value.apex_config import (
    ApexConfig,
    ApexDDPGConfig,
    ApexDQNConfig,
    ApexR2D2Config,
    build_model,
    variant,
)
from shoal.collect.ray import concat_episodes
from shoal.config import check
from shoal.core.device import to_host
from shoal.core.seeding import derive_seed
from shoal.core.types import ReplayBatch
from shoal.data.replay_shard import ReplayShard
from shoal.data.segments import SequenceShard
from shoal.distributed import require_ray
from shoal.envs import make_env
from shoal.envs.shapes import as_discrete
from shoal.fast.backend import uncompiled_copy
from shoal.nn.policy import ActorPolicy
from shoal.optim import check_finite_metrics

__all__ = [
    "Apex",
    "ApexActor",
    "ApexConfig",
    "ApexDDPGConfig",
    "ApexDQNConfig",
    "ApexR2D2Config",
    "Variant",
    "build_model",
    "ddpg_priorities",
    "dqn_priorities",
    "exploration_scales",
    "per_worker_epsilons",
    "variant",
]


PREFETCH = 2
"""Sample requests kept queued per shard: the next batches are on their way while the
learner trains on some."""
BATCHES_PER_REQUEST = 4
"""Learner batches per shard request: one round trip (and one priority update) per four
learner steps, so that the learner does not wait on Ray's latency."""


class Apex:
    """Ape-X's learner process: actors and shards as Ray actors, the learner here. An
    iteration handles actor batches and learner steps as they come, until
    ``steps_per_iteration`` new env steps arrived.

    Checkpoints hold the learner (networks, targets, optimizer), the counters and the deployed
    policy; not the shards' contents nor the actors' envs, so a resumed run refills replay
    (learning restarts once it holds learning_starts transitions) and restarts episodes."""

    def __init__(self, config: ApexConfig):
        self.config = config
        self.parts = variant(config)
        self.replay = self.parts.inner.replay
        run = config.run
        batch = self.replay.batch_size
        split = f"must be <= replay.batch_size ({batch}): each batch is split among the learners"
        check(run, "learners", run.learners <= batch, split)
        # One env here first: an unknown env id or an unsupported action space fails now,
        # with its own message, not as actors failing and restarting in a loop.
        probe = make_env(dataclasses.replace(config.env, num_envs=1))
        self._spaces = (probe.observation_space, probe.action_space)
        mask = probe.action_mask
        self._mask_dim = None if mask is None else int(as_discrete(probe.action_space).n)
        probe.close()
        inner, learner_fn = self.parts.inner, self.parts.learner_fn
        self.learner: Any
        if run.learners == 1:
            self.learner = learner_fn(inner, *self._spaces)
        else:  # each replay batch split among data-parallel copies on Ray actors
            share = SequenceShare if isinstance(config, ApexR2D2Config) else ReplayShare
            self.learner = ReplayLearnerGroup(learner_fn, inner, *self._spaces, share_cls=share)
        self._rw = rw = require_ray()
        rw.connect(
            run.ray_address,
            num_cpus=max(os.cpu_count() or 1, run.runners + config.replay_shards + 1),
        )
        self._weights_ref: Any = None
        self.actors = rw.WorkerPool(
            self.parts.actor_cls or ApexActor,
            lambda i: (config, i, self.parts),
            run.runners,
            name="Ape-X actor",
            max_restarts=run.max_worker_restarts,
            on_restart=self._restore_actor,
        )
        self.shards = rw.WorkerPool(
            self.parts.shard_cls or ReplayShard,
            self._shard_args,
            config.replay_shards,
            name="replay shard",
            max_restarts=run.max_worker_restarts,
        )
        self.scales = exploration_scales(config, self.parts)
        self.env_steps = 0
        self.iteration = 0
        self._pending: dict[Any, tuple[str, int]] = {}
        self._idle_actors = list(range(run.runners))
        self._queued = [0] * config.replay_shards
        self._sizes = [0] * config.replay_shards
        self._next_shard = 0
        self._push_weights()

    def _shard_args(self, j: int) -> tuple:
        cfg, replay = self.config, self.replay
        capacity = -(-replay.buffer_size // cfg.replay_shards)
        seed = derive_seed(cfg.run.seed, "replay", j)
        if self.parts.shard_cls is SequenceShard:
            return capacity, replay.priority_alpha, seed
        return (
            capacity,
            *self._spaces,
            replay.n_step,
            replay.priority_alpha,
            seed,
            self._mask_dim,
        )

    def train_iteration(self) -> dict[str, float]:
        goal = self.env_steps + self.config.steps_per_iteration
        stats: list[dict[str, torch.Tensor]] = []
        episodes = []
        self._start_actors()
        while self.env_steps < goal:
            if self.config.results_in_turn:
                ref = next(iter(self._pending))  # the oldest request; `_result` waits for it
            else:
                ref = self._rw.wait_first(list(self._pending))
            kind, i = self._pending.pop(ref)
            result = self._result(kind, i, ref)
            if kind == "sample":
                self._idle_actors.append(i)
                if result is not None:
                    episodes.append(self._store(*result))
            else:
                self._queued[i] -= 1
                if result is not None:
                    stats.extend(self._learn(i, result))
            self._request_replay()
            self._start_actors()
        self.iteration += 1
        return self._metrics(stats, episodes)

    def _result(self, kind: str, i: int, ref: Any) -> Any:
        """The result of a request, or None when its actor failed and was restarted."""
        try:
            return self._rw.get(ref)
        except self._rw.WORKER_FAILURES as exc:
            for other in [r for r, key in self._pending.items() if key == (kind, i)]:
                del self._pending[other]  # queued on the dead actor: died with it
            if kind == "replay":
                self._queued[i], self._sizes[i] = 0, 0  # restarts empty
            (self.actors if kind == "sample" else self.shards).restart(i, exc)
            return None

    def _store(self, batch: Any, priorities: Any, episodes: Any, steps: int):
        """Count an actor batch's env steps and send its transitions (or sequences) to the
        next shard."""
        self.env_steps += steps
        if batch is not None:
            j = self._next_shard
            self._next_shard = (j + 1) % len(self._sizes)
            self.shards.submit(j, "add", batch, priorities)  # ordered before later samples
            capacity = -(-self.replay.buffer_size // self.config.replay_shards)
            count = len(batch.steps) if isinstance(batch, ReplayBatch) else len(batch["valid"])
            self._sizes[j] = min(capacity, self._sizes[j] + count)
        return episodes

    def _request_replay(self) -> None:
        """Keep PREFETCH requests queued per shard once replay holds learning_starts
        transitions, unless the learner is a prefetch window ahead of training_intensity."""
        cfg = self.config
        replay = self.replay
        if sum(self._sizes) < max(replay.learning_starts, 1):
            return
        window = PREFETCH * BATCHES_PER_REQUEST * replay.batch_size
        for j, size in enumerate(self._sizes):
            while size > 0 and self._queued[j] < PREFETCH:
                in_flight = sum(self._queued) * BATCHES_PER_REQUEST * replay.batch_size
                if cfg.training_intensity is not None and self._backlog() + window <= in_flight:
                    return
                ref = self.shards.submit(
                    j, "sample_many", BATCHES_PER_REQUEST, replay.batch_size, replay.priority_beta
                )
                self._pending[ref] = ("replay", j)
                self._queued[j] += 1

    def _learn(self, j: int, batches: list[ReplayBatch]) -> list[dict]:
        """Learner steps on shard ``j``'s batches; their new priorities go back to ``j``."""
        if not batches:  # empty (restarted): no more requests until actors refill it
            self._sizes[j] = 0
            return []
        stats, indices, priorities = [], [], []
        for batch in batches:
            metrics, new_priorities = self.learner.update(batch)
            stats.append(metrics)
            indices.append(batch.indices)
            priorities.append(new_priorities.detach().cpu().numpy())
            if self.learner.grad_steps % self.config.weight_sync_every == 0:
                self._push_weights()
        self.shards.submit(
            j, "update_priorities", np.concatenate(indices), np.concatenate(priorities)
        )
        return stats

    def _backlog(self) -> float:
        """Replayed transitions the learner owes the env steps so far at training_intensity
        (negative: it is ahead)."""
        cfg = self.config
        owed = (cfg.training_intensity or 0.0) * (self.env_steps - self.replay.learning_starts)
        return owed - self.learner.grad_steps * self.replay.batch_size

    def _throttled(self) -> bool:
        """Actors wait for the learner (training_intensity) while it has batches coming.
        Together with `_request_replay` this holds the replay ratio whatever the speeds of
        actors and learner, so that learning per env step does not depend on the machine."""
        if self.config.training_intensity is None or not any(self._queued):
            return False
        return self._backlog() > 0

    def _start_actors(self) -> None:
        while self._idle_actors and not self._throttled():
            i = self._idle_actors.pop(0)
            random = self.env_steps < self.replay.learning_starts
            self._pending[self.actors.submit(i, "sample", random)] = ("sample", i)

    def _acting_weights(self) -> dict[str, Any]:
        """Host copies of the acting network (and DDPG's critic, for its priorities)."""
        if isinstance(self.config, ApexDDPGConfig):
            learner = self.learner
            local = learner.synchronized() if isinstance(learner, ReplayLearnerGroup) else learner
            core = local.core
            return {
                "model": to_host(core.actor.state_dict()),
                "critic": to_host(core.critic.state_dict()),
            }
        return {"model": to_host(self.learner.policy_network.state_dict())}

    def _push_weights(self) -> None:
        """To the object store once; each actor applies it before its next batch."""
        self._weights_ref = self._rw.put(self._acting_weights())
        self.actors.tell_all("set_weights", self._weights_ref)

    def _restore_actor(self, i: int) -> None:
        if self._weights_ref is not None:
            self.actors.call_one(i, "set_weights", self._weights_ref)

    def _metrics(self, stats: list[dict], episodes: list) -> dict[str, float]:
        metrics: dict[str, float] = {}
        if stats:
            means = torch.stack([torch.stack(list(s.values())) for s in stats]).mean(0)
            metrics.update(zip(stats[0], means.tolist(), strict=True))
            check_finite_metrics(metrics)  # a GPU learner's NaN check
        ddpg_variant = isinstance(self.config, ApexDDPGConfig)
        metrics["train/noise_scale_mean" if ddpg_variant else "train/epsilon_mean"] = float(
            np.mean(self.scales)
        )
        metrics["train/grad_steps"] = self.learner.grad_steps
        metrics["train/learner_steps_per_iteration"] = len(stats)
        metrics["train/replay_size"] = sum(self._sizes)
        metrics["train/actor_restarts"] = self.actors.restarts
        metrics["train/shard_restarts"] = self.shards.restarts
        if episodes:
            metrics.update(concat_episodes(episodes).metrics())
        return metrics

    def policy(self) -> ActorPolicy:
        network = uncompiled_copy(self.learner.policy_network)
        return ActorPolicy(network, None, self.config.env.clip_obs)

    def state_dict(self) -> dict[str, Any]:
        return {
            "learner": self.learner.state_dict(),
            "policy": {"model": self.learner.policy_network.state_dict(), "obs_stats": None},
            "counters": {"env_steps": self.env_steps, "iteration": self.iteration},
        }

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        """Restore the learner and counters; returns False: replay and episodes restart."""
        self.learner.load_state_dict(state["learner"])
        self.env_steps = int(state["counters"]["env_steps"])
        self.iteration = int(state["counters"]["iteration"])
        self._push_weights()
        return False

    def close(self) -> None:
        self._pending.clear()
        self.actors.close()
        self.shards.close()
        if isinstance(self.learner, ReplayLearnerGroup):  # its Ray actors and placement group
            self.learner.close()


SPECS = (
    AlgorithmSpec(
        "apex-dqn",
        ApexDQNConfig,
        Apex,
        build_model,
        "Ape-X DQN: Ray actors with per-actor epsilon, sharded prioritized replay, n-step "
        "double DQN",
        "Discrete",
        runners=True,
        learner_groups=True,
    ),
    AlgorithmSpec(
        "apex-ddpg",
        ApexDDPGConfig,
        Apex,
        build_model,
        "Ape-X DPG: Ray actors with per-actor noise, sharded prioritized replay, n-step DDPG",
        "Box (bounded)",
        runners=True,
        learner_groups=True,
    ),
    AlgorithmSpec(
        "apex-r2d2",
        ApexR2D2Config,
        Apex,
        build_model,
        "Distributed R2D2: recurrent Ray actors with the epsilon ladder, sharded sequence replay",
        "Discrete",
        runners=True,
        learner_groups=True,
    ),
)
"""The names this module registers (`shoal.algos.spec`, `shoal.registry`)."""
