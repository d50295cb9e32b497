"""Proximal Policy Optimization (Schulman et al. 2017, arXiv:1707.06347).

Clipped surrogate objective over minibatch SGD epochs on GAE advantages, with optional clipped
value loss, adaptive KL penalty (RLlib's ``kl_coeff``/``kl_target``) and KL
early stopping. Discrete actions use a categorical policy, continuous ones a diagonal Gaussian.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import gymnasium as gym
import torch

from shoal.algos.cores.checks import check_bptt_chunk, check_learner_group, check_masks
from shoal.algos.cores.metrics import mean_metrics, step_metrics
from shoal.algos.cores.on_policy import ModelLearner, OnPolicyCore, held
from shoal.algos.cores.rollout_batch import (
    RolloutBatch,
    RolloutSequenceBatch,
    make_batch,
    make_sequence_batch,
)
from shoal.config import (
    EnvConfig,
    ModelConfig,
    OptimConfig,
    RunConfig,
    SelfPlayConfig,
    check,
    check_choices,
    check_positive,
    is_nested,
)
from shoal.config.usage import OWN_GAMMA, Gate
from shoal.core.device import to_device
from shoal.fast.backend import evaluate_objective, learner_step
from shoal.losses import adaptive_kl_coeff
from shoal.losses.objectives import Objective, ppo_objective
from shoal.nn import ActorCritic, RecurrentActorCritic, build_actor_critic
from shoal.nn.policy import ActorPolicy
from shoal.nn.recurrent import chunk_start_states
from shoal.optim.schedules import scheduled


@dataclass(frozen=True)
class PPOConfig:
    """PPO hyperparameters. The defaults are the common settings of the PPO paper's MuJoCo
    experiments and of Stable-Baselines3 (2048 samples per rollout, 10 epochs of minibatches
    of 64, Adam 3e-4), a safe start on a new task; the tuned examples hold faster settings
    for specific ones."""

    run: RunConfig = field(default_factory=RunConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    num_steps: int = 256
    """Steps per environment in each rollout (rollout size = num_steps * env.num_envs, times
    run.runners with Ray runners)."""
    num_epochs: int = 10
    """Passes of minibatch SGD over each rollout."""
    minibatch_size: int = 64
    """Samples per gradient step (Stable-Baselines3's 64: with 256, the defaults swung
    Pendulum up on no seed in 300k env steps, with 64 on 4 of 5; benchmarks/README.md,
    "Defaults that learn")."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.95
    """GAE lambda: 0 is one-step TD, 1 is Monte-Carlo."""
    clip_eps: float = 0.2
    """Clip range of the probability ratio."""
    clip_schedule: Literal["constant", "linear"] = "constant"
    """linear: decay clip_eps to zero over optim.anneal_steps."""
    value_clip: float | None = None
    """Use the clipped value loss with this range (None: the plain squared error)."""
    vf_coef: float = 0.5
    """Weight of the value loss."""
    ent_coef: float = 0.0
    """Weight of the entropy bonus."""
    normalize_advantages: bool = True
    """Standardize advantages within each minibatch."""
    target_kl: float | None = None
    """Stop the epochs of an iteration early once the approximate KL exceeds this."""
    kl_coeff: float = 0.0
    """Initial coefficient of the KL penalty to the rollout policy (0 disables it)."""
    kl_target: float = 0.01
    """KL the adaptive penalty steers toward: coefficient x1.5 above 2x, x0.5 below 0.5x."""
    policies: dict[str, dict[str, Any]] = field(default_factory=dict)
    """MAPPO and IPPO with several policies (`shoal.algos.multi_agent.multi_policy`): settings
    of single policies over the run's, {policy: {field: value}} in YAML or the Python API, e.g.
    {"adversary": {"optim": {"lr": 3e-4}, "ent_coef": 0.01}}; {"frozen": true} keeps a
    policy at its initial weights (it acts, and never learns)."""
    self_play: SelfPlayConfig = field(default_factory=SelfPlayConfig)
    """MAPPO and IPPO: self-play against a pool of past snapshots (off by default)."""
    bptt_chunk: int | None = None
    """Recurrent models (model.lstm_hidden): truncated backpropagation through time over
    pieces of this many steps per env (None: the whole rollout, num_steps). It must divide
    num_steps, and a minibatch holds whole pieces: minibatch_size a multiple of the piece, or
    at most one piece (then each minibatch is one piece)."""

    GATES: ClassVar[dict[str, Gate]] = {
        "kl_target": Gate(
            "kl_coeff", lambda c: c > 0, "with the adaptive KL penalty (kl_coeff > 0)"
        )
    }
    UNUSED: ClassVar[dict[str, str]] = OWN_GAMMA

    def __post_init__(self) -> None:
        check_positive(self, "num_steps", "num_epochs", "minibatch_size", "clip_eps")
        check_choices(self)
        check(self, "gamma", 0.0 <= self.gamma <= 1.0, "must be in [0, 1]")
        check(self, "gae_lambda", 0.0 <= self.gae_lambda <= 1.0, "must be in [0, 1]")
        check(self, "vf_coef", self.vf_coef >= 0, "must be >= 0")
        check(self, "kl_coeff", self.kl_coeff >= 0, "must be >= 0")
        check_positive(self, "kl_target")
        if not is_nested(self):  # a nested block's run and env are its variant's
            rollout = self.num_steps * self.env.num_envs * max(1, self.run.runners)
            check(
                self,
                "minibatch_size",
                self.minibatch_size <= rollout,
                f"must be <= num_steps * env.num_envs (* run.runners) = {rollout}",
            )
            check_masks(self, "PPO")
            check_learner_group(self, "PPO", self.minibatch_size)
            check(
                self,
                "target_kl",
                self.target_kl is None or self.run.learners == 1,
                "stops the epochs of one learner; use None with run.learners > 1",
            )
        if self.value_clip is not None:
            check_positive(self, "value_clip")
        if self.target_kl is not None:
            check_positive(self, "target_kl")
        check_bptt_chunk(self)
        if self.model.lstm_hidden is not None and self.minibatch_size > self.chunk:
            check(
                self,
                "minibatch_size",
                self.minibatch_size % self.chunk == 0,
                f"must be a multiple of bptt_chunk = {self.chunk} (minibatches hold whole "
                "pieces), or at most one piece",
            )

    @property
    def chunk(self) -> int:
        """Steps per truncated-BPTT piece of a recurrent model."""
        return self.bptt_chunk or self.num_steps


def build_model(
    config: PPOConfig, obs_space: gym.Space, action_space: gym.Space
) -> ActorCritic | RecurrentActorCritic:
    return build_actor_critic(obs_space, action_space, config.model)


class PPOLearner(ModelLearner[ActorCritic | RecurrentActorCritic]):
    """Owns the actor-critic and its optimizer; turns a `RolloutBatch` into minibatch SGD steps on
    the PPO objective (`shoal.losses.objectives.ppo_objective`), through autograd or the NumPy
    path (`shoal.fast.backend.learner_step`)."""

    def __init__(self, config: PPOConfig, obs_space: gym.Space, action_space: gym.Space):
        self.config = config
        self.setup(config, build_model(config, obs_space, action_space))
        self.step = learner_step(
            self.model, config.model.backend, self.device, config.run.compile, self.scaler
        )
        self.generator: torch.Generator | None = None
        """Draws the minibatch order (None: torch's global generator). APPO gives the learner
        one of its own, so that a sampler thread's action draws cannot interleave with it."""

    def objective(self, clip_eps: float, kl_coeff: float) -> Objective:
        cfg = self.config
        return ppo_objective(
            clip_eps, cfg.vf_coef, cfg.ent_coef, cfg.value_clip, kl_coeff, cfg.normalize_advantages
        )

    def losses(
        self, batch: RolloutBatch, clip_eps: float, kl_coeff: float
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """The objective's loss terms and diagnostics on a feed-forward batch through
        autograd (no step)."""
        objective = self.objective(clip_eps, kl_coeff)
        return evaluate_objective(self.model, objective, to_device(batch, self.device))

    def update(
        self,
        batch: RolloutBatch | RolloutSequenceBatch,
        lr: float,
        clip_eps: float,
        kl_coeff: float,
    ) -> dict[str, float]:
        """``num_epochs`` passes of minibatch steps (fewer when ``target_kl`` stops them);
        returns the loss terms and diagnostics averaged over the steps."""
        cfg = self.config
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        batch = to_device(batch, self.device)
        objective = self.objective(clip_eps, kl_coeff)
        rows: list[dict] = []
        epochs_done = 0
        for _ in range(cfg.num_epochs):
            first = len(rows)
            for minibatch, outputs in self._minibatches(batch):
                losses, stats = self.step(
                    objective, minibatch, self.optimizer, cfg.optim.max_grad_norm, outputs
                )
                rows.append(step_metrics(losses, stats))
            epochs_done += 1
            kl = cfg.target_kl
            if kl is not None and mean_metrics(rows[first:])["train/approx_kl"] > kl:
                break
        metrics = mean_metrics(rows)
        metrics["train/epochs"] = epochs_done
        metrics["train/lr"] = lr
        return metrics

    def _minibatches(
        self, batch: RolloutBatch | RolloutSequenceBatch
    ) -> Iterator[tuple[RolloutBatch, tuple | None]]:
        """One epoch's minibatches (and, recurrent, the model's outputs on them)."""
        if isinstance(batch, RolloutSequenceBatch):
            return self._sequence_epoch(batch)
        return self._epoch(batch)

    def _epoch(self, batch: RolloutBatch) -> Iterator[tuple[RolloutBatch, None]]:
        """Feed-forward minibatches of one epoch: shuffled samples."""
        n, size = batch.obs.shape[0], self.config.minibatch_size
        # Shuffle once per epoch, then take contiguous slices (views, no copies). A single
        # minibatch holding the whole batch needs no shuffle: its loss is a mean.
        shuffled = batch
        if size < n:
            permutation = torch.randperm(n, generator=self.generator).to(batch.obs.device)
            shuffled = batch.map(lambda x: x[permutation])
        for start in range(0, n, size):
            minibatch = shuffled.map(operator.itemgetter(slice(start, start + size)))
            if minibatch.obs.shape[0] < 2:
                continue  # a lone sample cannot be standardized; skip the remainder
            yield minibatch, None

    def _sequence_epoch(self, batch: RolloutSequenceBatch) -> Iterator[tuple[RolloutBatch, tuple]]:
        """Recurrent minibatches of one epoch: shuffled whole pieces of env sequences.

        Each piece starts from the state the current network reaches over the rollout,
        recomputed once per epoch from the rollout's stored initial state. States stored
        while sampling would be those of older weights from the second epoch on; the
        recomputation costs one gradient-free forward pass per epoch and keeps the start of
        every piece consistent with the network being trained (on the first epoch it equals
        what the sampler saw). The gradient stops at piece boundaries (truncated BPTT)."""
        chunk = self.config.chunk
        model = self.model
        assert isinstance(model, RecurrentActorCritic)  # sequence batches are recurrent ones
        states = chunk_start_states(
            model, batch.rollout_obs, batch.initial_state, batch.rollout_starts, chunk
        ).flatten(0, 1)
        n, per = states.shape[0], max(1, self.config.minibatch_size // chunk)
        order = torch.randperm(n, generator=self.generator) if per < n else torch.arange(n)
        order = order.to(states.device)
        for start in range(0, n, per):
            index = order[start : start + per]
            keep = batch.valid[:, index].flatten()
            if int(keep.sum()) < 2:
                continue
            features, _ = model(batch.chunks.obs[:, index], states[index], batch.starts[:, index])
            outputs = model.heads(features.flatten(0, 1)[keep])
            yield batch.chunks.map(functools.partial(_pieces, index=index, keep=keep)), outputs


def _pieces(x: torch.Tensor, index: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """The valid steps ``keep`` of the pieces ``index`` of ``x`` ``[chunk, pieces, ...]``."""
    return x[:, index].flatten(0, 1)[keep]


class PPO:
    """One PPO iteration: sample a rollout, estimate advantages, update, broadcast weights."""

    env_steps = held("env_steps")
    iteration = held("iteration")
    learner = held("learner")
    sampler = held("sampler")

    joint = False
    """One policy acts (its spec declares ``acts_jointly`` for `MultiPolicyPPO`'s sake)."""

    def __init__(self, config: PPOConfig):
        self.kl_coeff = config.kl_coeff
        self.config = config
        self.core = OnPolicyCore(self.config, PPOLearner, build_model, "PPO")
        self.core.broadcast(set_temperature=True)

    def train_iteration(self) -> dict[str, float]:
        cfg = self.config
        progress = self.core.progress()
        lr = scheduled(cfg.optim.lr_schedule, cfg.optim.lr, progress)
        clip_eps = scheduled(cfg.clip_schedule, cfg.clip_eps, progress)
        rollout, episodes = self.core.sample()
        batch: RolloutBatch | RolloutSequenceBatch
        if cfg.model.lstm_hidden is None:
            batch = make_batch(rollout, cfg.gamma, cfg.gae_lambda)
        else:
            batch = make_sequence_batch(rollout, cfg.gamma, cfg.gae_lambda, cfg.chunk)
        metrics = self.learner.update(batch, lr, clip_eps, self.kl_coeff)
        if cfg.kl_coeff > 0:
            self.kl_coeff = adaptive_kl_coeff(
                self.kl_coeff, metrics["train/approx_kl"], cfg.kl_target
            )
            metrics["train/kl_coeff"] = self.kl_coeff
        return self.core.finish_iteration(metrics, episodes)

    def state_dict(self) -> dict[str, Any]:
        return {**self.core.state_dict(), "kl_coeff": self.kl_coeff}

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        self.kl_coeff = state["kl_coeff"]
        return self.core.load_state_dict(state)

    def policy(self) -> ActorPolicy:
        return self.core.policy()

    def close(self) -> None:
        self.core.close()
