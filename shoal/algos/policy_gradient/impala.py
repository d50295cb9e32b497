"""IMPALA: importance-weighted actor-learner (Espeholt et al. 2018, arXiv:1802.01561).

Runners sample with the weights they last received while the learner trains; the learner
recomputes log-probabilities and values with its current network, corrects for the runners'
staleness with V-trace (`shoal.losses.vtrace`) and steps on policy gradient + vf_loss_coeff *
value loss - entropy_coeff * entropy. Field names and defaults follow RLlib's (its 2018
algorithm documentation).

With ``run.runners >= 1`` rollouts arrive from `RaySampler.stream` as runners finish them;
each arriving runner then gets the latest weights snapshot (refreshed every
``broadcast_interval`` arrivals) and ``train/policy_lag`` logs how many updates old the
weights behind each rollout were. With ``run.runners == 0`` the same update runs in-process,
synchronously (lag 0).

Each rollout's end bootstraps from the runner's value (``Rollout.last_values``; rollouts carry
no later observation), at most ``policy_lag`` updates old; RLlib drops the last step instead.
Checkpoints hold learner, optimizer, counters, replay generator and the runners' envs, not
rollouts in flight, the replay buffer or the minibatch ring: in-process runs resume exactly,
runs with Ray runners continue from the saved weights (which runner finishes first is timing).
"""

from __future__ import annotations

import collections
import functools
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import gymnasium as gym
import torch

from shoal.algos.cores.checks import check_no_masks
from shoal.algos.cores.group_shares import ColumnShare
from shoal.algos.cores.learner_group import LearnerGroup
from shoal.algos.cores.metrics import mean_metrics, step_metrics
from shoal.algos.cores.on_policy import ModelLearner, OnPolicyCore, held
from shoal.algos.spec import AlgorithmSpec
from shoal.collect.ray import concat_episodes, concat_rollouts
from shoal.config import (
    EnvConfig,
    ModelConfig,
    OptimConfig,
    RunConfig,
    check,
    check_choices,
    check_positive,
)
from shoal.config.usage import OWN_GAMMA, Gate
from shoal.core.device import to_device
from shoal.core.seeding import derive_seed
from shoal.core.types import EpisodeStats, Rollout
from shoal.losses import vtrace
from shoal.losses.objectives import PolicyOutputs, Targets, a2c_objective
from shoal.nn import ActorCritic, RecurrentActorCritic, build_actor_critic
from shoal.nn.policy import ActorPolicy
from shoal.optim import minimize, rmsprop_or_adamw
from shoal.optim.schedules import scheduled


@dataclass(frozen=True)
class IMPALAConfig:
    """IMPALA hyperparameters, named after RLlib's keys where shoal has no
    equivalent; each field names the RLlib key it stands for."""

    run: RunConfig = field(default_factory=RunConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-3, max_grad_norm=40.0))
    """RLlib's lr (its 5e-4 is tuned for Atari with 32 workers; 1e-3 learns CartPole in
    40k-70k steps), lr_schedule, epsilon (optim.eps) and grad_clip (optim.max_grad_norm)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    num_steps: int = 50
    """Steps per environment in each rollout (RLlib's sample_batch_size)."""
    gamma: float = 0.99
    """Discount factor."""
    vtrace: bool = True
    """Correct for the runners' stale policies with V-trace (RLlib's vtrace); False treats
    every rollout as on-policy (rho = c = 1: n-step returns with the learner's values)."""
    vtrace_clip_rho_threshold: float | None = 1.0
    """rho-bar, the clip of the importance ratios in the value targets (None: no clip)."""
    vtrace_clip_pg_rho_threshold: float | None = 1.0
    """The clip of the importance ratios weighting the policy gradient (None: no clip)."""
    vtrace_clip_c_threshold: float | None = 1.0
    """c-bar, the clip of the trace coefficients (the paper's; RLlib fixes it at 1)."""
    train_batch_size: int | None = None
    """Env steps per learner update: arriving rollouts (num_steps * env.num_envs each) are
    joined until they hold this many (RLlib's train_batch_size). None: one rollout."""
    num_sgd_iter: int = 1
    """Gradient steps taken on each train batch (RLlib's num_sgd_iter)."""
    minibatch_buffer_size: int = 1
    """Train batches kept for reuse while num_sgd_iter > 1: steps cycle over this many
    batches, each used num_sgd_iter times (RLlib's minibatch_buffer_size)."""
    replay_proportion: float = 0.0
    """Replayed rollouts per new one, mixed into the train batches: 1.5 replays one rollout
    always and a second one half the time (RLlib's replay_proportion; 0 disables)."""
    replay_buffer_num_slots: int = 100
    """Rollouts kept for replay, the oldest dropped first (RLlib's replay_buffer_num_slots)."""
    max_sample_requests_in_flight_per_worker: int = 2
    """Sample requests queued on each Ray runner, so it never waits for weights; a rollout
    can then be that many weight updates old (RLlib's key of the same name)."""
    results_in_turn: bool = False
    """Take rollouts in turn (runner 0, 1, ..., 0, ...) instead of as they arrive. Runners
    still sample at once and rollouts are as stale as with runners of equal speed, but which
    one the learner takes next, and so which weights each request is sent, is counted, not
    timed: two runs of one seed are then identical (the learning test uses this)."""
    broadcast_interval: int = 1
    """Refresh the weights snapshot sent to arriving runners after this many arrivals (RLlib's
    broadcast_interval); every arriving runner gets the current snapshot."""
    optimizer: Literal["adam", "rmsprop", "rmsprop-tf"] = "adam"
    """RLlib's opt_type. adam: AdamW (decoupled weight decay); rmsprop: PyTorch's RMSProp, with
    rms_decay, rms_momentum and epsilon optim.eps; rmsprop-tf: the same rule as the paper's
    TensorFlow ran it (average starting at 1, epsilon inside the square root; `shoal.optim`)."""
    rms_decay: float = 0.99
    """RMSProp's squared-gradient smoothing (RLlib's decay)."""
    rms_momentum: float = 0.0
    """RMSProp momentum (RLlib's momentum)."""
    vf_loss_coeff: float = 0.5
    """Weight of the value loss (RLlib's vf_loss_coeff)."""
    entropy_coeff: float = 0.01
    """Weight of the entropy bonus, positive (RLlib's entropy_coeff, whose -0.01 means the
    same bonus in its sign convention)."""

    GATES: ClassVar[dict[str, Gate]] = {
        name: Gate("run.runners", lambda n: n > 0, "with Ray runners (run.runners > 0)")
        for name in ("results_in_turn", "broadcast_interval")
    }
    UNUSED: ClassVar[dict[str, str]] = OWN_GAMMA

    def __post_init__(self) -> None:
        check_positive(self, "num_steps", "num_sgd_iter", "minibatch_buffer_size")
        check_positive(self, "replay_buffer_num_slots", "broadcast_interval")
        check_positive(self, "max_sample_requests_in_flight_per_worker")
        check_choices(self)
        check(self, "gamma", 0.0 <= self.gamma <= 1.0, "must be in [0, 1]")
        for clip in ("rho", "pg_rho", "c"):
            value = getattr(self, name := f"vtrace_clip_{clip}_threshold")
            check(self, name, value is None or value > 0, "must be > 0 (None: no clip)")
        size = self.train_batch_size
        rollout = self.num_steps * self.env.num_envs
        ok = size is None or (size > 0 and size % rollout == 0)
        allowed = f"must be a positive multiple of num_steps * env.num_envs = {rollout}"
        check(self, "train_batch_size", ok, allowed)
        check(self, "replay_proportion", self.replay_proportion >= 0, "must be >= 0")
        check(self, "rms_decay", 0.0 < self.rms_decay < 1.0, "must be in (0, 1)")
        check(self, "rms_momentum", self.rms_momentum >= 0, "must be >= 0")
        check(self, "vf_loss_coeff", self.vf_loss_coeff >= 0, "must be >= 0")
        check(self, "entropy_coeff", self.entropy_coeff >= 0, "must be >= 0 (a bonus)")
        model, unsupported = self.model, "IMPALA does not support it yet; set it to None"
        check(model, "lstm_hidden", model.lstm_hidden is None, unsupported)
        check(model, "temperature_min", model.temperature_min is None, unsupported)
        check_no_masks(self, "IMPALA")
        columns = self.env.num_envs * self.rollouts_per_batch  # a learner group splits them
        split = f"must be <= the {columns} env columns of a train batch (each learner takes some)"
        check(self.run, "learners", self.run.learners <= columns, split)

    @property
    def rollouts_per_batch(self) -> int:
        """Rollouts (new and replayed) joined into one train batch."""
        rollout = self.num_steps * self.env.num_envs
        return (self.train_batch_size or rollout) // rollout


def build_model(config: IMPALAConfig, obs_space: gym.Space, action_space: gym.Space) -> Any:
    return build_actor_critic(obs_space, action_space, config.model)


def make_optimizer(config: IMPALAConfig, parameters: list[torch.Tensor]) -> torch.optim.Optimizer:
    return rmsprop_or_adamw(
        config.optimizer, parameters, config.optim, config.rms_decay, config.rms_momentum
    )


class IMPALALearner(ModelLearner[ActorCritic | RecurrentActorCritic]):
    """Owns the actor-critic and its optimizer; V-trace targets and one gradient step per
    call of `update`, on a time-major rollout batch, on the A2C objective's terms
    (`shoal.losses.objectives.a2c_objective`: policy gradient on the V-trace advantages,
    value regression toward ``v_s``, entropy bonus)."""

    def __init__(self, config: IMPALAConfig, obs_space: gym.Space, action_space: gym.Space):
        self.config = config
        model = build_model(config, obs_space, action_space)
        self.setup(config, model, functools.partial(make_optimizer, config))
        self.objective = a2c_objective(config.vf_loss_coeff, config.entropy_coeff)
        self.minimize = minimize
        """The gradient step, a part: a learner group's rank swaps in one that all-reduces
        (`shoal.algos.cores.group_shares.SharedMinimize`)."""

    def losses(self, rollout: Rollout) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        """The loss terms (``total`` last) and V-trace diagnostics of one rollout batch."""
        cfg = self.config
        steps, envs = rollout.rewards.shape[:2]
        dist, values = self.model(rollout.obs.flatten(0, 1))
        log_probs = dist.log_prob(rollout.actions.flatten(0, 1)).view(steps, envs)
        values = values.view(steps, envs)
        # With next-step autoreset the value of step t + 1's observation is that of the true
        # next state of step t, final observations included (see `Rollout.next_values`).
        next_values = torch.cat([values[1:].detach(), rollout.last_values.unsqueeze(0)])
        target = log_probs.detach() if cfg.vtrace else rollout.log_probs
        targets = vtrace(
            rollout.log_probs,
            target,
            rollout.rewards,
            values.detach(),
            next_values,
            rollout.terminated,
            rollout.truncated,
            cfg.gamma,
            cfg.vtrace_clip_rho_threshold,
            cfg.vtrace_clip_c_threshold,
            cfg.vtrace_clip_pg_rho_threshold,
        )
        valid = rollout.valid  # autoreset steps are no real transitions
        entropy = dist.entropy().view(steps, envs)
        outputs = PolicyOutputs(log_probs[valid], entropy[valid], values[valid])
        advantages, returns = targets.pg_advantages[valid], targets.vs[valid]
        constants = Targets(rollout.log_probs[valid], values[valid].detach(), advantages, returns)
        losses, _ = self.objective.losses(outputs, constants)
        rhos = torch.exp(log_probs.detach() - rollout.log_probs)[valid]
        rho_bar = cfg.vtrace_clip_rho_threshold or math.inf
        diagnostics = {"train/rho_mean": rhos.mean().item()}
        diagnostics["train/rho_clipped"] = (rhos > rho_bar).float().mean().item()
        return losses, diagnostics

    def update(self, rollout: Rollout, lr: float) -> dict[str, float]:
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        losses, metrics = self.losses(to_device(rollout, self.device))
        self.minimize(losses, self.optimizer, self.config.optim.max_grad_norm, scaler=self.scaler)
        metrics.update(mean_metrics([step_metrics(losses, {})]))
        return metrics


class IMPALA:
    """One iteration: gather a train batch of arriving rollouts (plus replay), take
    num_sgd_iter gradient steps with V-trace, and hand weights to the runners that arrived.
    The sampler, counters, deployable policy and checkpoint layout are its
    `OnPolicyCore`'s; the weights reach runners as they arrive (`_sync`), and all of
    them at the start and after a restore (`publish_weights`)."""

    env_steps = held("env_steps")
    iteration = held("iteration")
    learner = held("learner")
    sampler = held("sampler")

    def __init__(self, config: IMPALAConfig):
        self.updates = 0
        """Gradient steps taken: the version of the learner's weights."""
        self.asynchronous = config.run.runners > 0
        self.config = config
        self.core = OnPolicyCore(
            self.config, IMPALALearner, build_model, "IMPALA", takes_action_masks=False,
            # run.learners > 1: each learner takes env columns of the batch
            group=functools.partial(LearnerGroup, share_cls=ColumnShare),
        )  # fmt: skip
        self.core.publish = self.publish_weights
        self.core.broadcast(set_temperature=True)
        self._replay = collections.deque[Rollout](maxlen=config.replay_buffer_num_slots)
        self._replay_rng = torch.Generator().manual_seed(derive_seed(config.run.seed, "replay"))
        self._pending: list[Rollout] = []
        self._ring: list[list[Any]] = [[None, 0] for _ in range(config.minibatch_buffer_size)]
        self._ring_index = 0
        self._stream: Any = None

    def publish_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Send a snapshot of the current weights to every runner (at the start and after a
        restore), with the versions each runner holds and has queued."""
        self._weights = self._copy_weights()
        self.sampler.set_weights(self._weights)
        self._snapshot, self._since_snapshot = self.updates, 0
        runners = self.config.run.runners or 1
        self._held = [self.updates] * runners
        in_flight = self.config.max_sample_requests_in_flight_per_worker
        self._queued = [collections.deque([self.updates] * in_flight) for _ in range(runners)]

    def _next_rollout(self) -> tuple[int, Rollout, EpisodeStats, int]:
        """``(runner, rollout, episodes, version of the weights that sampled it)``."""
        if not self.asynchronous:
            rollout, episodes = self.sampler.sample()
            # The local runner's buffers are reused by its next rollout: keep a copy.
            rollout = Rollout(*(x.clone() if torch.is_tensor(x) else x for x in rollout))
            return 0, rollout, episodes, self._held[0]
        if self._stream is None:
            in_flight = self.config.max_sample_requests_in_flight_per_worker
            in_turn = self.config.results_in_turn
            self._stream = self.sampler.stream(in_flight=in_flight, in_turn=in_turn)
        runner, rollout, episodes = next(self._stream)
        return runner, rollout, episodes, self._queued[runner].popleft()

    def _sync(self, runner: int) -> None:
        """Hand ``runner`` the weights snapshot before its next sample request, refreshing the
        snapshot once ``broadcast_interval`` runners got the last one (RLlib's AsyncSamples
        optimizer); in-process sampling always gets the newest weights."""
        self._since_snapshot += 1
        refresh = not self.asynchronous or self._since_snapshot >= self.config.broadcast_interval
        if refresh and self._snapshot != self.updates:
            self._snapshot, self._since_snapshot = self.updates, 0
            self._weights = self._copy_weights()
        if self._held[runner] != self._snapshot:
            if self.asynchronous:
                self.sampler.set_weights(self._weights, runners=[runner])
            else:
                self.sampler.set_weights(self._weights)
            self._held[runner] = self._snapshot
        if self.asynchronous:  # the runner's next sample request will use these weights
            self._queued[runner].append(self._held[runner])

    def _copy_weights(self) -> dict[str, torch.Tensor]:
        # A snapshot, not views of the live parameters: a runner served later gets the
        # weights of the snapshot's version, as the policy-lag metric assumes.
        return {k: v.detach().clone() for k, v in self.learner.get_weights().items()}

    def _replayed(self) -> list[Rollout]:
        """Stored rollouts to mix in after a new one (RLlib's MixInReplay: only once the
        buffer holds more than a train batch, ``replay_proportion`` per new rollout)."""
        chosen: list[Rollout] = []
        if len(self._replay) <= self.config.rollouts_per_batch:
            return chosen
        share = self.config.replay_proportion
        while torch.rand((), generator=self._replay_rng).item() < share:
            share -= 1.0
            index = int(torch.randint(len(self._replay), (), generator=self._replay_rng))
            chosen.append(self._replay[index])
        return chosen

    def train_iteration(self) -> dict[str, float]:
        cfg = self.config
        needed = cfg.rollouts_per_batch
        lags, episodes, replayed, runner = [], [], 0, None
        # Replay can leave a full batch pending; then this iteration trains on it alone.
        while len(self._pending) < needed:
            if runner is not None:
                self._sync(runner)
            runner, rollout, stats, version = self._next_rollout()
            agents = self.sampler.agents_per_env
            self.core.env_steps += rollout.rewards.numel() // agents
            self.core.episodes += stats.returns.size // agents
            lags.append(self.updates - version)
            episodes.append(stats)
            self._pending.append(rollout)
            if cfg.replay_proportion > 0:
                extra = self._replayed()
                replayed += len(extra)
                self._pending.extend(extra)
                self._replay.append(rollout)
        batch = concat_rollouts(self._pending[:needed])
        self._pending = self._pending[needed:]
        lr = scheduled(cfg.optim.lr_schedule, cfg.optim.lr, self.core.progress())
        metrics = self._sgd(batch, lr)
        if runner is not None:
            self._sync(runner)  # the runner that completed the batch gets weights trained on it
            metrics["train/policy_lag"] = sum(lags) / len(lags)
            metrics["train/policy_lag_max"] = max(lags)
            metrics.update(concat_episodes(episodes).metrics())
        self.core.iteration += 1
        metrics["train/lr"] = lr
        if cfg.replay_proportion > 0:
            metrics["train/replayed_rollouts"] = replayed
        if self.sampler.restarts:
            metrics["perf/sampler_restarts"] = self.sampler.restarts
        return metrics

    def _sgd(self, batch: Rollout, lr: float) -> dict[str, float]:
        """Gradient steps cycling over the minibatch ring (RLlib's MinibatchBuffer): each slot
        holds a train batch for num_sgd_iter steps; stop where a slot needs a batch that has
        not arrived yet. Returns the mean metrics of the steps."""
        ring, steps = self._ring, 0
        pending: Rollout | None = batch
        sums: collections.Counter[str] = collections.Counter()
        while True:
            slot = ring[self._ring_index]
            if slot[1] == 0:
                if pending is None:
                    break
                slot[:], pending = [pending, self.config.num_sgd_iter], None
            sums.update(self.learner.update(slot[0], lr))
            steps += 1
            self.updates += 1
            slot[1] -= 1
            if slot[1] == 0:
                slot[0] = None
            self._ring_index = (self._ring_index + 1) % len(ring)
        metrics = {k: v / steps for k, v in sums.items()}
        metrics["train/sgd_steps"] = steps
        return metrics

    def state_dict(self) -> dict[str, Any]:
        state = self.core.state_dict()
        state["counters"]["updates"] = self.updates
        state["replay_rng"] = self._replay_rng.get_state()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        """Restore; returns False when the envs could not be restored mid-episode. With Ray
        runners the run continues from the saved weights but not exactly (module docstring)."""
        self.updates = state["counters"]["updates"]
        self._replay_rng.set_state(state["replay_rng"])
        return self.core.load_state_dict(state)

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()  # cancels the requests still in flight
        self.core.close()

    def policy(self) -> ActorPolicy:
        return self.core.policy()


SPECS = (
    AlgorithmSpec(
        "impala",
        IMPALAConfig,
        IMPALA,
        build_model,
        "IMPALA: asynchronous actor-learner with V-trace off-policy correction (Ray runners)",
        "Discrete, Box, MultiDiscrete, MultiBinary, Tuple, Dict",
        runners=True,
        learner_groups=True,
    ),
)
"""The names this module registers (`shoal.algos.spec`, `shoal.registry`)."""
