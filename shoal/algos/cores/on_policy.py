"""What the on-policy algorithms (PPO, A2C, REINFORCE, TRPO) share: the batches they train
on, built from a `Rollout`, and the plumbing around their updates (`OnPolicyAlgorithm`).

Advantages and returns are GAE over the time-major rollout (`shoal.losses.gae`; lambda 1 gives
n-step returns bootstrapped at the rollout's end). Feed-forward learners take the valid
transitions flattened into one batch; recurrent learners take pieces of the env sequences so
that the recurrent state can be replayed through them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any, Generic, NamedTuple, TypeVar

import gymnasium as gym
import numpy as np
import torch

from shoal.backend import place, uncompiled_copy
from shoal.collect import make_sampler
from shoal.config import check, check_positive
from shoal.data.rollout import episode_starts, to_chunks
from shoal.device import (
    check_precision,
    grad_scaler,
    load_scaler_state,
    resolve_device,
    scaler_state,
    to_host,
)
from shoal.errors import ConfigError
from shoal.losses import gae
from shoal.nn.heads import apply_temperature
from shoal.optim import build_optimizer, check_finite_metrics
from shoal.policy import ActorPolicy
from shoal.seeding import derive_seed
from shoal.types import EpisodeStats, Rollout


class RolloutBatch(NamedTuple):
    """Flat ``[N, ...]`` training samples: the valid transitions of a rollout with their
    advantages and returns, what PPO, A2C, TRPO, ACKTR, APPO and DD-PPO learn from (it was
    ``PPOBatch``)."""

    obs: torch.Tensor
    actions: torch.Tensor
    log_probs: torch.Tensor
    values: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    action_mask: torch.Tensor | None = None
    """``[N, A]`` legal actions at each observation, where the env reports them."""

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> RolloutBatch:
        """``fn`` applied to every field (the mask too, when there is one)."""
        return RolloutBatch(*(None if x is None else fn(x) for x in self))  # type: ignore[arg-type]


class RolloutSequenceBatch(NamedTuple):
    """Training data of a recurrent model: ``chunks`` holds ``[chunk, N, ...]`` pieces of the
    env sequences (`shoal.data.rollout.to_chunks`), with their ``valid`` and episode
    ``starts`` flags; the rest recomputes the state at each piece's start."""

    chunks: RolloutBatch
    valid: torch.Tensor
    starts: torch.Tensor
    rollout_obs: torch.Tensor
    rollout_starts: torch.Tensor
    initial_state: torch.Tensor


def _gae(rollout: Rollout, gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    return gae(
        rollout.rewards,
        rollout.values,
        rollout.next_values,
        rollout.terminated,
        rollout.truncated,
        gamma,
        lam,
    )


def make_sequence_batch(
    rollout: Rollout, gamma: float, lam: float, chunk: int
) -> RolloutSequenceBatch:
    """GAE over the rollout, then pieces of ``chunk`` steps per env (autoreset steps stay in
    place, flagged invalid, so that the sequences keep their timing)."""
    advantages, returns = _gae(rollout, gamma, lam)
    starts = episode_starts(rollout.valid)
    fields = (rollout.obs, rollout.actions, rollout.log_probs, rollout.values, advantages, returns)
    return RolloutSequenceBatch(
        RolloutBatch(*(to_chunks(x, chunk) for x in fields)),
        to_chunks(rollout.valid, chunk),
        to_chunks(starts, chunk),
        rollout.obs,
        starts,
        rollout.policy_state,
    )


def make_batch(rollout: Rollout, gamma: float, lam: float) -> RolloutBatch:
    """GAE over the time-major rollout, then keep only the real (non-autoreset) transitions,
    flat. Rollouts live on the CPU, so this runs on NumPy views of their memory: a dozen
    NumPy calls cost a fraction of the same tensor ops' dispatch on rollouts this small."""
    values = rollout.values.numpy()
    next_values = np.concatenate([values[1:], rollout.last_values.numpy()[None]])
    advantages, returns = gae(
        rollout.rewards.numpy(),
        values,
        next_values,
        rollout.terminated.numpy(),
        rollout.truncated.numpy(),
        gamma,
        lam,
    )
    keep = rollout.valid.numpy().reshape(-1)

    def flat(x: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(x.reshape(keep.size, *x.shape[2:])[keep])

    return RolloutBatch(
        flat(rollout.obs.numpy()),
        flat(rollout.actions.numpy()),
        flat(rollout.log_probs.numpy()),
        flat(values),
        flat(advantages),
        flat(returns),
        None if rollout.action_mask is None else flat(rollout.action_mask.numpy()),
    )


def rmsprop_or_adamw(
    kind: str, parameters: list[torch.Tensor], optim: Any, alpha: float, momentum: float = 0.0
) -> torch.optim.Optimizer:
    """The optimizer of A2C, A3C, ACER and IMPALA: ``rmsprop`` (PyTorch's) or ``rmsprop-tf``
    (Mnih et al. 2016's rule as TensorFlow runs it, `shoal.optim.RMSpropTF`), each with
    smoothing ``alpha``, epsilon ``optim.eps`` and weight decay as an L2 term, or ``adam``,
    AdamW (decoupled weight decay); ``optim`` is an `OptimConfig`. All update every parameter
    in a few multi-tensor ops (PyTorch's CPU default loops over the tensors, which costs more
    than the arithmetic on small networks)."""
    kind = kind if kind in ("rmsprop", "rmsprop-tf") else "adamw"
    return build_optimizer(
        parameters, kind, optim.lr, optim.eps, optim.weight_decay, alpha, momentum
    )


def check_bptt_chunk(config: Any) -> None:
    """Validate ``bptt_chunk`` of a config with ``model.lstm_hidden``, ``num_steps`` and a
    ``chunk`` property (the chunk length in effect)."""
    if config.model.lstm_hidden is None:
        check(config, "bptt_chunk", config.bptt_chunk is None, "needs model.lstm_hidden set")
        return
    if config.bptt_chunk is not None:
        check_positive(config, "bptt_chunk")
    check(
        config,
        "bptt_chunk",
        config.num_steps % config.chunk == 0,
        f"must divide num_steps = {config.num_steps}",
    )


def check_masks(config: Any, algo: str) -> None:
    """Legal-action masks (``env.action_mask``) train through autograd and feed-forward
    models: the learner restricts the policy to the actions that were legal, as the sampler
    did (`evaluate_objective`)."""
    if config.env.action_mask == "none":
        return
    check(
        config.model,
        "backend",
        config.model.backend != "numpy",
        f"{algo} with env.action_mask trains through autograd: use auto or torch",
    )
    check(
        config.model,
        "lstm_hidden",
        config.model.lstm_hidden is None,
        "recurrent models do not support action masks yet; set env.action_mask to none",
    )


NO_MASKS = "does not use action masks yet (PPO, A2C and TRPO do)"


def check_no_masks(config: Any, algo: str) -> None:
    """For the learners that do not restrict their policy to legal actions: refuse
    ``env.action_mask`` (`masked_config` refuses the masks an env reports by itself)."""
    env = config.env
    check(env, "action_mask", env.action_mask == "none", f"{algo} {NO_MASKS}; set it to none")


def masked_config(config: Any, algo: str, supported: bool) -> Any:
    """``config`` for a learner whose rollouts carry legal-action masks: the masked policy
    trains through autograd (the NumPy path has no masks), so ``auto`` becomes ``torch``."""
    if not supported:
        raise ConfigError(f"{algo} {NO_MASKS}, and this env reports them")
    if config.model.backend == "numpy":
        raise ConfigError(
            "model.backend = 'numpy' cannot train with the action masks this env reports; "
            "use auto or torch"
        )
    model = dataclasses.replace(config.model, backend="torch")
    return dataclasses.replace(config, model=model)


def mean_metrics(rows: Iterable[dict[str, Any]]) -> dict[str, float]:
    """Per-name means over steps of metrics that are tensors (kept on their device until here:
    one conversion per update, not one per step) or floats."""
    rows = list(rows)
    names = list(rows[0])
    tensors = isinstance(rows[0][names[0]], torch.Tensor)
    if len(rows) == 1 and not tensors:
        return {name: float(value) for name, value in rows[0].items()}
    if tensors:
        table = torch.stack([torch.stack([row[k] for k in names]).float() for row in rows])
        means = dict(zip(names, table.mean(0).tolist(), strict=True))
        check_finite_metrics(means)  # a GPU learner's NaN check (`shoal.optim.gradients`)
        return means
    array = np.array([[row[k] for k in names] for row in rows], dtype=np.float64)
    return dict(zip(names, array.mean(0).tolist(), strict=True))


def step_metrics(losses: dict[str, Any], stats: dict[str, Any]) -> dict[str, Any]:
    """One gradient step's loss terms as ``loss/<name>`` and diagnostics as ``train/<name>``."""
    row = {f"loss/{name}": value for name, value in losses.items()}
    row.update((f"train/{name}", value) for name, value in stats.items())
    return row


Model = TypeVar("Model", bound=torch.nn.Module)


class ModelLearner(Generic[Model]):
    """What every on-policy learner has around its update: one ``model`` on the run's device
    whose weights go to the samplers, its ``optimizer``, and their checkpoint state."""

    model: Model
    optimizer: torch.optim.Optimizer

    def setup(
        self,
        config: Any,
        model: Model,
        make_optimizer: Callable[[list[torch.Tensor]], torch.optim.Optimizer] | None = None,
    ) -> None:
        """Put ``model`` on ``config.run.device`` (compiled with ``run.compile``) and build its
        optimizer (``make_optimizer(parameters)``; by default AdamW with ``config.optim``'s
        settings), and float16's gradient scaler (``model.precision``)."""
        self.device = resolve_device(config.run.device)
        check_precision(config.model.precision, self.device)
        self.model = place(model, self.device, config.run.compile)
        self.parameters: list[torch.Tensor] = list(self.model.parameters())
        if make_optimizer is None:
            optim = config.optim
            decay = optim.weight_decay
            self.optimizer = build_optimizer(self.parameters, "adamw", optim.lr, optim.eps, decay)
        else:
            self.optimizer = make_optimizer(self.parameters)
        self.scaler = grad_scaler(config.model.precision, self.device)

    def get_weights(self) -> dict[str, torch.Tensor]:
        """The model's ``state_dict()``: detached tensors sharing the weights' memory (a
        receiver copies them). The module walk is done once: ``state_dict`` visits every
        submodule, which costs more than the copies on a small model, while the parameter
        and buffer objects of a built model stay the same (``load_state_dict`` and the
        optimizer write into them in place)."""
        cached = getattr(self, "_weight_entries", None)
        if cached is None or cached[0] is not self.model:
            cached = self._weight_entries = (self.model, self.model.state_dict(keep_vars=True))
        if self.device.type == "cpu":
            return {name: tensor.detach() for name, tensor in cached[1].items()}
        return to_host(cached[1])

    def set_weights(self, weights: dict[str, torch.Tensor]) -> None:
        self.model.load_state_dict(weights)

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            **scaler_state(getattr(self, "scaler", None)),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        load_scaler_state(getattr(self, "scaler", None), state)


class OnPolicyAlgorithm:
    """The plumbing PPO, A2C, REINFORCE, TRPO, ACKTR (and, for their sampling, ACER and
    R2D2) share around their update: one runner over the env config, counters, the
    temperature schedule, the weights broadcast after each update, the deployable policy and
    the checkpoint layout. Each algorithm derives from this
    (never from another algorithm) and adds its own update and any extra state."""

    takes_action_masks = True
    """Whether the learner restricts its policy to the legal actions in the rollouts."""

    def __init__(
        self,
        config: Any,
        learner_cls: Callable[[Any, gym.Space, gym.Space], Any],
        build_model: Callable[[Any, gym.Space, gym.Space], Any],
    ):
        self.config = config
        # Reward normalization scales by the std of returns discounted with the algorithm's gamma.
        env_config = dataclasses.replace(config.env, gamma=config.gamma)
        self.sampler = make_sampler(
            env_config,
            lambda obs_space, action_space: build_model(config, obs_space, action_space),
            config.num_steps,
            config.run,
            acting=config.model.backend,
        )
        sampler = self.sampler
        try:
            if sampler.action_masked:  # also multi-agent envs whose observations carry masks
                config = masked_config(config, type(self).__name__, self.takes_action_masks)
            self.learner = learner_cls(config, sampler.observation_space, sampler.action_space)
        except BaseException:
            sampler.close()  # its envs (and Ray runners) go with the failed start
            raise
        self.env_steps = 0
        self.episodes = 0
        self.iteration = 0
        self._broadcast(set_temperature=True)

    def progress(self) -> float:
        """Fraction of the schedules' horizon done (``optim.anneal_steps`` or total steps)."""
        optim = self.config.optim
        return self.env_steps / (optim.anneal_steps or self.config.run.total_steps)

    def sample(self) -> tuple[Rollout, EpisodeStats]:
        """The next rollout, counted."""
        rollout, episodes = self.sampler.sample()
        self.count(rollout, episodes)
        return rollout, episodes

    def count(self, rollout: Rollout, episodes: EpisodeStats) -> None:
        """Add a rollout's env steps and episodes to the counters, and the iteration."""
        # Multi-agent envs have a row per (env, agent): count env steps and env episodes.
        agents = self.sampler.agents_per_env
        self.env_steps += rollout.rewards.numel() // agents
        self.episodes += episodes.returns.size // agents
        self.iteration += 1

    def finish_iteration(
        self, metrics: dict[str, float], episodes: EpisodeStats
    ) -> dict[str, float]:
        """After the update: log the temperature the rollout was sampled with, schedule the
        next one and hand the new weights to the sampler; add the episode metrics."""
        if self.temperature is not None:
            metrics["train/temperature"] = self.temperature
        if self.sampler.restarts:
            metrics["perf/sampler_restarts"] = self.sampler.restarts
        self._broadcast()
        metrics.update(episodes.metrics())
        return metrics

    def _broadcast(self, set_temperature: bool = False) -> None:
        """Hand the learner's weights to the sampler, with the temperature for the next
        rollout: the scheduled one, or with ``set_temperature`` the constant one (when the
        learner is built or its weights were loaded from a checkpoint, which may hold another
        value; nothing else changes it)."""
        # The temperature is a buffer of the weights, so the next rollout is sampled with it
        # and its update uses the same value, as probability ratios need.
        if set_temperature or self.config.model.temperature_min is not None:
            self.temperature = apply_temperature(
                self.learner.model, self.config.model, self.env_steps, self.episodes
            )
        self.publish_weights(self.learner.get_weights())

    def publish_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Where the learner's weights go after each update (the sampler's policy; APPO's
        sampler thread takes versioned copies instead)."""
        self.sampler.set_weights(weights)

    def policy(self) -> ActorPolicy:
        return ActorPolicy(
            uncompiled_copy(self.learner.model), self.sampler.obs_stats(), self.config.env.clip_obs
        )

    def state_dict(self) -> dict[str, Any]:
        return {
            "learner": self.learner.state_dict(),
            "sampler": self.sampler.get_state(),
            "policy": {
                "model": self.learner.model.state_dict(),
                "obs_stats": self.sampler.obs_stats(),
            },
            "counters": {
                "env_steps": self.env_steps,
                "episodes": self.episodes,
                "iteration": self.iteration,
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        """Restore; returns False when the envs could not be restored mid-episode."""
        self.learner.load_state_dict(state["learner"])
        self.env_steps = state["counters"]["env_steps"]
        self.episodes = state["counters"]["episodes"]
        self.iteration = state["counters"]["iteration"]
        self._broadcast(set_temperature=True)
        fallback = derive_seed(self.config.run.seed, "env-restart", self.iteration)
        return self.sampler.set_state(state["sampler"], fallback)

    def close(self) -> None:
        self.sampler.close()
