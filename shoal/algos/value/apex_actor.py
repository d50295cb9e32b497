"""The sampling side of Ape-X (`shoal.algos.value.apex`, Horgan et al. 2018, arXiv:1803.00933): the
per-actor exploration ladder, the actors' initial priorities, `ApexActor`, which steps its
vector env, cuts n-step transitions and scores them with DQN's or DDPG's losses, and
`SequenceActor`, R2D2's (Kapturowski et al. 2019), which steps a recurrent Q-network, cuts
sequences and scores them with R2D2's loss. Run as Ray actors by the driver through
`shoal.distributed`; nothing here imports ``ray``."""

from __future__ import annotations

from functools import partial
from typing import Any, NamedTuple, Protocol

import numpy as np
import torch

from shoal.algos.value import dqn, r2d2
from shoal.collect.env_runner import EnvRunner
from shoal.config import EnvConfig, RunConfig
from shoal.core.seeding import derive_seed
from shoal.core.types import ReplayBatch
from shoal.data.replay import ReplayBuffer
from shoal.data.sequences import SequenceBuilder
from shoal.envs.shapes import as_discrete
from shoal.losses import bootstrap_discount, n_step_return
from shoal.losses.actor_critic import ensemble_td_loss, twin_min_target
from shoal.losses.sequence_q import sequence_priorities


class ApexActorConfig(Protocol):
    """The fields of an Ape-X config (`shoal.algos.value.apex_config.ApexConfig`) its actors read
    (read-only, as a frozen config's are)."""

    @property
    def run(self) -> RunConfig: ...

    @property
    def env(self) -> EnvConfig: ...

    @property
    def rollout_steps(self) -> int: ...

    @property
    def exploration_epsilon(self) -> float: ...

    @property
    def exploration_alpha(self) -> float: ...

    @property
    def per_worker_exploration(self) -> bool: ...

    @property
    def worker_side_prioritization(self) -> bool: ...


class Variant(NamedTuple):
    """The single-process algorithm config an Ape-X config stands for, and its builders
    (`shoal.algos.value.apex_config.variant`)."""

    inner: Any
    """The `DQNConfig`, `DDPGConfig` or `R2D2Config` whose learner and networks Ape-X
    reuses."""
    learner_fn: Any
    model_fn: Any
    """``model_fn(inner, obs_space, action_space)``: the acting network."""
    actor_cls: Any = None
    """The actors' class: `ApexActor` (None) or `SequenceActor`."""
    shard_cls: Any = None
    """The replay shards' class: `shoal.data.replay_shard.ReplayShard` (None) or
    `shoal.data.segments.SequenceShard`."""
    critic_fn: Any = None
    """``critic_fn(inner, obs_space, action_space)``: the critic an actor scores its
    transitions with, for a variant whose acting network is a deterministic actor (DDPG's,
    exploring with ``inner.noise``); None where it is a Q-network (DQN's, R2D2's)."""


def per_worker_epsilons(num_workers: int, epsilon: float = 0.4, alpha: float = 7.0) -> list:
    """Ape-X's exploration ladder (Horgan et al. 2018, section 4.1): actor i of N explores with
    ``epsilon ** (1 + i / (N - 1) * alpha)``, from ``epsilon`` down to ``epsilon ** (1 +
    alpha)`` (0.4 ** 8 = 0.00066), so some actors gather diverse data and others near-greedy
    returns. A single actor gets ``epsilon``."""
    if num_workers == 1:
        return [epsilon]
    return [epsilon ** (1 + i / (num_workers - 1) * alpha) for i in range(num_workers)]


def exploration_scales(config: ApexActorConfig, parts: Variant) -> list[float]:
    """Each actor's epsilon (DQN) or noise scale (DDPG); ``parts`` is ``variant(config)``."""
    n, eps = config.run.runners, config.exploration_epsilon
    ladder = per_worker_epsilons(n, eps, config.exploration_alpha)
    if not config.per_worker_exploration:
        ladder = [eps] * n
    if parts.critic_fn is not None:  # a deterministic actor's Gaussian noise
        return [parts.inner.noise.scale * e / eps for e in ladder]
    return ladder


def actor_runner(
    config: ApexActorConfig, index: int, parts: Variant, acting: str, compiled: bool
) -> EnvRunner:
    """Actor ``index``'s vector env and acting network, seeded by its index."""
    seed = config.run.seed
    return EnvRunner(
        config.env,
        partial(parts.model_fn, parts.inner),
        config.rollout_steps,
        seed=derive_seed(seed, "env", index),
        torch_seed=derive_seed(seed, "actor-torch", index),
        acting=acting,
        compiled=compiled,
    )


@torch.no_grad()
def dqn_priorities(model: Any, batch: ReplayBatch, config: dqn.DQNConfig) -> torch.Tensor:
    """``[N]`` |TD errors| of an actor's transitions under its Q-network copy, which stands in
    for the target network too (actors keep none; the learner rescores each transition the
    first time it replays it)."""
    n = batch.obs.shape[0]
    returns = n_step_return(batch.rewards, config.gamma)
    discounts = bootstrap_discount(batch.steps, batch.terminated, config.gamma)
    out, next_out = model(torch.cat([batch.obs, batch.next_obs])).split(n)
    out_taken = out[torch.arange(n), batch.actions.long()]
    online = next_out if config.double_q else None
    _, priorities = model.kind.loss(out_taken, next_out, online, returns, discounts, batch)
    return priorities


@torch.no_grad()
def ddpg_priorities(actor: Any, critic: Any, batch: ReplayBatch, config: Any) -> torch.Tensor:
    """``[N]`` |TD errors| of an actor's transitions under its actor and critic copies (which
    stand in for the targets: DDPG's target ``r + gamma^K Q(s', mu(s'))``)."""
    returns = n_step_return(batch.rewards, config.gamma)
    discounts = bootstrap_discount(batch.steps, batch.terminated, config.gamma)
    next_q = critic(batch.next_obs, actor(batch.next_obs)).squeeze(-1)
    target = twin_min_target(returns, discounts, next_q)
    q = critic(batch.obs, actor.scaler.to_unit(batch.actions)).squeeze(-1)
    _, priorities = ensemble_td_loss(q, target, batch.weights, config.critic_loss)
    return priorities


class ApexActor:
    """One Ape-X actor (a Ray actor): its vector env and acting network (`EnvRunner`), its
    exploration rate, the n-step cutting of its steps (a small `ReplayBuffer` holding one
    batch and the n steps before it) and, for DDPG's priorities, a critic copy.

    ``parts`` is ``variant(config)`` (`shoal.algos.value.apex_config`): the DQN or DDPG
    config, learner and network builder that the Ape-X config stands for."""

    def __init__(self, config: ApexActorConfig, index: int, parts: Variant):
        self.config = config
        self.parts = parts
        self.runner = actor_runner(
            config, index, parts, parts.inner.model.backend, config.run.compile
        )
        env, self.model = self.runner.env, self.runner.model
        self.ddpg = parts.critic_fn is not None
        self.critic = None
        if self.ddpg and config.worker_side_prioritization:
            self.critic = parts.critic_fn(
                parts.inner, env.observation_space, env.action_space
            ).requires_grad_(False)
        self.scale = exploration_scales(config, parts)[index]
        self.mask_dim = None if env.action_mask is None else int(as_discrete(env.action_space).n)
        steps, n, envs = config.rollout_steps, parts.inner.replay.n_step, env.num_envs
        self.windows = ReplayBuffer(
            (steps + n + 1) * envs,
            envs,
            env.observation_space,
            env.action_space,
            n_step=n,
            action_mask_dim=self.mask_dim,
        )
        self.rows = 0
        self._explore()

    def _explore(self) -> None:
        if self.ddpg:
            self.model.noise.scale = self.scale
        else:  # the weights carry the learner's epsilon buffer: set this actor's own
            self.model.epsilon.fill_(self.scale)

    def set_weights(self, weights: dict[str, Any]) -> None:
        self.model.load_state_dict(weights["model"])
        if self.critic is not None:
            self.critic.load_state_dict(weights["critic"])
        self._explore()

    def sample(self, random_actions: bool = False) -> tuple:
        """One batch: ``(transitions or None, priorities or None, episodes, env steps)``.
        ``random_actions``: DDPG acts uniformly at random (before learning starts)."""
        if self.ddpg:
            self.model.random_actions.fill_(random_actions)
        rollout, episodes = self.runner.sample()
        self.windows.extend(*rollout.transitions())
        batch = self._completed_windows(len(rollout.rewards))
        priorities = None
        if batch is not None and self.config.worker_side_prioritization:
            if self.ddpg:
                priorities = ddpg_priorities(self.model, self.critic, batch, self.parts.inner)
            else:
                priorities = dqn_priorities(self.model, batch, self.parts.inner)
        host = None if priorities is None else priorities.numpy()
        return batch, host, episodes, rollout.rewards.numel()

    def _completed_windows(self, new_rows: int) -> ReplayBatch | None:
        """The n-step transitions that the last ``new_rows`` rows completed: rows ``r`` with
        ``r + n`` now written (the window and its bootstrap row), valid steps only."""
        buffer, n = self.windows, self.parts.inner.replay.n_step
        rows = np.arange(max(0, self.rows - n), self.rows + new_rows - n) % buffer.rows
        self.rows += new_rows
        positions = (rows[:, None] * buffer.num_envs + np.arange(buffer.num_envs))[
            buffer.valid[rows]
        ]
        if positions.size == 0:
            return None
        return buffer.windows(positions)


@torch.no_grad()
def r2d2_priorities(model: Any, batch: dict[str, np.ndarray], config: Any) -> torch.Tensor:
    """``[k]`` R2D2 priorities of an actor's sequences under its network copy, which stands in
    for the target network too."""
    fields = r2d2.time_major({name: torch.from_numpy(x) for name, x in batch.items()})
    _, td, valid = r2d2.sequence_td(model, model, fields, config)
    return sequence_priorities(td.abs(), valid, config.replay.priority_eta)


class SequenceActor:
    """One R2D2 actor (a Ray actor): its vector env and recurrent Q-network (`EnvRunner`, which
    records the state before every step), its epsilon from the ladder, and the cutting of its
    episodes into sequences (`SequenceBuilder`). ``parts`` is ``variant(config)`` with
    `R2D2Config` inside."""

    def __init__(self, config: ApexActorConfig, index: int, parts: Variant):
        self.config = config
        self.parts = parts
        self.runner = actor_runner(config, index, parts, "torch", compiled=False)
        self.model = self.runner.model
        inner = parts.inner
        rows = self.runner.num_envs * self.runner.env.agents_per_env
        self.builder = SequenceBuilder(rows, inner.burn_in, inner.length, inner.period)
        self.scale = exploration_scales(config, parts)[index]
        self.model.epsilon.fill_(self.scale)

    def set_weights(self, weights: dict[str, Any]) -> None:
        self.model.load_state_dict(weights["model"])
        self.model.epsilon.fill_(self.scale)  # the weights carry the learner's epsilon

    def sample(self, random_actions: bool = False) -> tuple:
        """One batch: ``(sequences [k, ...] or None, priorities or None, episodes, env
        steps)``; ``random_actions`` is DDPG's and unused here."""
        rollout, episodes = self.runner.sample()
        sequences = self.builder.add(rollout)
        steps = rollout.rewards.numel()
        if not sequences:
            return None, None, episodes, steps
        batch = {name: np.stack([s[name] for s in sequences]) for name in sequences[0]}
        priorities = None
        if self.config.worker_side_prioritization:
            priorities = r2d2_priorities(self.model, batch, self.parts.inner).numpy()
        return batch, priorities, episodes, steps
