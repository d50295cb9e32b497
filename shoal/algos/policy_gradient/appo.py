"""Asynchronous PPO (APPO): PPO whose sampling overlaps its learning, as in Petrenko et al.
2020 ("Sample Factory: Egocentric 3D Control from Pixels at 100000 FPS with Asynchronous
Reinforcement Learning") and RLlib's APPO.

A sampler thread (`shoal.collect.ahead.AheadSampler`) collects rollout ``n + 1`` while the
learner runs PPO's epochs on rollout ``n``: the envs and the acting network on one core, the
update on the other. Rollout ``n`` acts with exactly the weights of update ``n - max_lag``,
so the policy lag is fixed (``train/policy_lag`` logs it) and a seeded run is reproducible
and resumes exactly, whatever the threads' timing (the learner draws its minibatch order from
a generator of its own; the sampler thread owns torch's global one). ``max_lag`` 0 is the
synchronous fallback: no thread, PPO's loop with the correction below. With ``run.runners``
the thread drives the Ray runners, so sampling on a cluster overlaps the update the same way.

The correction for the lag (``correction``):

* ``clip`` (default): PPO's own batch (GAE on the behaviour values, the ratio against the
  behaviour policy), as Sample Factory trains by default: the clip bounds how far the stale
  rollout moves the policy, and nothing else changes.
* ``vtrace``: before the epochs, the learner's current network re-evaluates the rollout;
  V-trace (Espeholt et al. 2018, `shoal.losses.vtrace`, with PPO's gae_lambda as its
  lambda) turns the behaviour policy's log-probabilities and the current values into value
  targets and clipped importance-weighted advantages, and the clipped surrogate's ratio is
  taken against the current policy of the update's start: the decoupled objective of Hilton,
  Cobbe and Schulman 2021 ("Batch size-invariance for policy optimization"), whose proximal
  policy is the newest one and whose behaviour policy enters only through the clipped
  weights. The bootstrap at the rollout's end is the behaviour policy's value (rollouts carry
  no later observation), ``max_lag`` updates old. It is RLlib's default; on CartPole with
  ppo-cartpole's fast settings (lr 0.004), it learned far slower than ``clip`` at a lag of
  one (final evaluation 194-367 against 478-488 within 200k steps, seeds 0-3): the clipped
  weights cut V-trace's traces and shrink the advantages of actions the last update made
  rarer, while the critic is still far behind the returns.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import gymnasium as gym
import torch

from shoal.algos.cores.on_policy import OnPolicyCore, held
from shoal.algos.cores.rollout_batch import RolloutBatch, make_batch
from shoal.algos.policy_gradient import ppo as ppo_module
from shoal.algos.policy_gradient.ppo import PPOConfig, PPOLearner
from shoal.algos.spec import NUMPY_BACKENDS, AlgorithmSpec
from shoal.collect.ahead import AheadSampler
from shoal.config import (
    EnvConfig,
    RunConfig,
    check,
    check_block,
    check_choices,
    nested_block,
    unnest,
)
from shoal.config.usage import OWN_GAMMA
from shoal.core.device import to_device
from shoal.core.seeding import derive_seed
from shoal.core.types import EpisodeStats, Rollout
from shoal.losses import adaptive_kl_coeff, vtrace
from shoal.nn.policy import ActorPolicy
from shoal.optim.schedules import scheduled

# PPO's settings of APPO's learner (`shoal.config.nested_block`).
if TYPE_CHECKING:  # for the type checker, a block is its config class
    PPOBlock = PPOConfig
else:
    PPOBlock = nested_block(PPOConfig)


@dataclass(frozen=True)
class APPOConfig:
    """APPO: ``run`` and ``env`` as every algorithm, PPO's hyperparameters in the ``ppo``
    block, and how far sampling runs ahead and how the update corrects for it."""

    run: RunConfig = field(default_factory=RunConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    ppo: PPOBlock = field(default_factory=PPOBlock)
    """PPO's settings (`PPOConfig`: rollout, epochs, minibatches, clip, loss weights, optimizer,
    model); its own run and env blocks are not used: set the ones above."""
    max_lag: int = 1
    """Updates the sampler runs ahead: rollout n acts with the weights of update n - max_lag
    (1: double-buffered, every rollout sampled during the update before; 0: synchronous, no
    sampler thread)."""
    correction: Literal["clip", "vtrace"] = "clip"
    """clip: PPO's GAE batch, the ratio against the behaviour policy; vtrace: V-trace targets
    and advantages from the current network, the ratio against the current policy (decoupled
    PPO)."""
    vtrace_clip_rho_threshold: float | None = 1.0
    """rho-bar, the clip of the importance ratios in V-trace's value targets (None: no clip)."""
    vtrace_clip_pg_rho_threshold: float | None = 1.0
    """The clip of the importance ratios weighting the advantages (None: no clip)."""
    vtrace_clip_c_threshold: float | None = 1.0
    """c-bar, the clip of V-trace's trace coefficients (None: no clip)."""

    UNUSED: ClassVar[dict[str, str]] = {
        **OWN_GAMMA,
        "ppo.self_play.snapshot_every": "APPO trains one policy, without self-play",
    }

    def __post_init__(self) -> None:
        check(self, "max_lag", self.max_lag >= 0, "must be >= 0")
        check_choices(self)
        for name in ("vtrace_clip_rho_threshold", "vtrace_clip_pg_rho_threshold",
                     "vtrace_clip_c_threshold"):  # fmt: skip
            value = getattr(self, name)
            check(self, name, value is None or value > 0, "must be > 0 or None")
        ppo = check_block(self, "ppo")  # PPO's own checks, with the real env and run
        check(ppo, "model", ppo.model.lstm_hidden is None, "APPO has no recurrent models yet")

    def learner_config(self) -> PPOConfig:
        """The `PPOConfig` of the learner and sampler: ``ppo`` with ``run`` and ``env``."""
        return unnest(self.ppo, run=self.run, env=self.env)


def build_model(config: APPOConfig, obs_space: gym.Space, action_space: gym.Space) -> Any:
    """The deployable actor-critic: PPO's."""
    return ppo_module.build_model(config.learner_config(), obs_space, action_space)


def vtrace_batch(
    model: torch.nn.Module, rollout: Rollout, config: APPOConfig, device: torch.device
) -> RolloutBatch:
    """PPO's flat batch of a rollout's valid steps with V-trace's correction: ``log_probs``
    and ``values`` are the current network's (no gradient), ``returns`` V-trace's targets
    ``vs`` and ``advantages`` its clipped importance-weighted advantages, from the behaviour
    log-probabilities the rollout carries."""
    steps, envs = rollout.rewards.shape[:2]
    flat = lambda x: x.reshape(steps * envs, *x.shape[2:])  # noqa: E731
    obs, actions = flat(rollout.obs), flat(rollout.actions)
    mask = None if rollout.action_mask is None else flat(rollout.action_mask)
    chunk = max(4096, config.ppo.minibatch_size)  # bounds the activations of image inputs
    log_probs, values = [], []
    with torch.no_grad():
        for start in range(0, len(obs), chunk):
            part = slice(start, start + chunk)
            piece = to_device(obs[part], device)
            dist, value = (
                model(piece) if mask is None else model(piece, to_device(mask[part], device))
            )
            log_probs.append(dist.log_prob(to_device(actions[part], device)).float().cpu())
            values.append(value.float().cpu())
    log_probs_t = torch.cat(log_probs).reshape(steps, envs)
    values_t = torch.cat(values).reshape(steps, envs)
    next_values = torch.cat([values_t[1:], rollout.last_values.float()[None]])
    ppo = config.ppo
    out = vtrace(
        rollout.log_probs.float(), log_probs_t, rollout.rewards.float(), values_t, next_values,
        rollout.terminated, rollout.truncated, ppo.gamma, config.vtrace_clip_rho_threshold,
        config.vtrace_clip_c_threshold, config.vtrace_clip_pg_rho_threshold, ppo.gae_lambda,
    )  # fmt: skip
    keep = rollout.valid.reshape(-1)
    return RolloutBatch(
        obs[keep], actions[keep], flat(log_probs_t)[keep], flat(values_t)[keep],
        flat(out.pg_advantages)[keep], flat(out.vs)[keep], None if mask is None else mask[keep],
    )  # fmt: skip


class APPO:
    """One APPO iteration: take the rollout sampled during the last update, correct it,
    update, publish the weights as the next version."""

    env_steps = held("env_steps")
    iteration = held("iteration")
    learner = held("learner")
    sampler = held("sampler")

    def __init__(self, config: APPOConfig):
        self.appo = config
        self.ahead: AheadSampler | None = None
        self.kl_coeff = config.ppo.kl_coeff
        self.config = config.learner_config()
        self.core = OnPolicyCore(self.config, PPOLearner, ppo_module.build_model, "APPO")
        self.core.publish = self.publish_weights
        self.core.broadcast(set_temperature=True)
        self.own_generator = config.max_lag > 0 and config.run.learners == 1
        """The minibatch order drawn from a generator of the learner's own, apart from the
        sampler thread's draws (a learner group's ranks draw in processes of their own)."""
        if self.own_generator:
            self.learner.generator = torch.Generator().manual_seed(
                derive_seed(config.run.seed, "appo-minibatches")
            )
        if config.max_lag > 0:
            self.ahead = AheadSampler(self.sampler, config.max_lag)
            self.ahead.publish(self.iteration, self.learner.get_weights())

    def publish_weights(self, weights: dict[str, torch.Tensor]) -> None:
        if self.ahead is None:
            self.sampler.set_weights(weights)
        else:  # the weights of `iteration` updates: version `iteration`
            self.ahead.publish(self.iteration, weights)

    def next_rollout(self) -> tuple[Rollout, EpisodeStats, dict[str, float]]:
        if self.ahead is None:
            rollout, episodes = self.core.sample()
            return rollout, episodes, {"train/policy_lag": 0.0}
        start = time.perf_counter()
        ahead = self.ahead.take(self.iteration)
        waited = time.perf_counter() - start
        lag = self.iteration - ahead.version
        self.core.count(ahead.rollout, ahead.episodes)
        return (
            ahead.rollout,
            ahead.episodes,
            {"train/policy_lag": lag, "perf/sample_wait_s": waited},
        )

    def train_iteration(self) -> dict[str, float]:
        ppo = self.config
        progress = self.core.progress()
        lr = scheduled(ppo.optim.lr_schedule, ppo.optim.lr, progress)
        clip_eps = scheduled(ppo.clip_schedule, ppo.clip_eps, progress)
        rollout, episodes, lag_metrics = self.next_rollout()
        if self.appo.correction == "vtrace":
            batch = vtrace_batch(self.learner.model, rollout, self.appo, self.learner.device)
        else:
            batch = make_batch(rollout, ppo.gamma, ppo.gae_lambda)
        metrics = self.learner.update(batch, lr, clip_eps, self.kl_coeff)
        if ppo.kl_coeff > 0:
            self.kl_coeff = adaptive_kl_coeff(
                self.kl_coeff, metrics["train/approx_kl"], ppo.kl_target
            )
            metrics["train/kl_coeff"] = self.kl_coeff
        metrics.update(lag_metrics)
        return self.core.finish_iteration(metrics, episodes)

    def policy(self) -> ActorPolicy:
        if self.ahead is not None and self.config.env.normalize_obs:
            self.ahead.stop()  # the normalizer's statistics, not while the thread updates them
        return self.core.policy()

    def state_dict(self) -> dict[str, Any]:
        if self.ahead is not None:
            self.ahead.stop()  # the envs and the rollouts sampled ahead, between two rollouts
        state = {**self.core.state_dict(), "kl_coeff": self.kl_coeff}
        if self.ahead is not None:
            state["ahead"] = self.ahead.get_state()
        if self.own_generator:
            state["minibatch_rng"] = self.learner.generator.get_state()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        self.kl_coeff = state["kl_coeff"]
        if self.ahead is not None:
            self.ahead.set_state(state["ahead"])
        if self.own_generator and "minibatch_rng" in state:  # (not a group's checkpoint)
            self.learner.generator.set_state(state["minibatch_rng"])
        return self.core.load_state_dict(state)  # publishes the restored weights' version

    def close(self) -> None:
        if self.ahead is not None:
            self.ahead.close()
        self.core.close()


SPECS = (
    AlgorithmSpec(
        "appo",
        APPOConfig,
        APPO,
        build_model,
        "APPO: PPO sampling in a thread during the update, fixed policy lag, clip or V-trace",
        "Discrete, Box, MultiDiscrete, MultiBinary, Tuple, Dict",
        backends=NUMPY_BACKENDS,
        runners=True,
        learner_groups=True,
    ),
)
"""The names this module registers (`shoal.algos.spec`, `shoal.registry`)."""
