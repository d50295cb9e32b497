"""R2D2: recurrent experience replay in distributed reinforcement learning (Kapturowski,
Ostrovski, Quan, Munos and Dabney 2019, ICLR).

An LSTM Q-network (`shoal.nn.recurrent_q.RecurrentQNetwork`) acts epsilon-greedily in vector
envs; its rollouts keep the actor's recurrent state before every step, and
`shoal.data.sequences.SequenceBuilder` cuts them into overlapping sequences of
``burn_in + length`` steps that never cross an episode's end, each with the actor's state at
its start (the stored-state strategy). Sequences are replayed by priority
(`shoal.data.segments.SequenceReplay`, priority ``eta max |delta| + (1 - eta) mean |delta|``,
`shoal.losses.sequence_q.sequence_priorities`). Each update unrolls the online network from the
stored state through the burn-in without gradient (refreshing the stale state), then through
the rest of the sequence, where the loss is: n-step double-Q targets inside the sequence
(`sequence_n_step_targets`) under the invertible value rescaling
``h(x) = sign(x) (sqrt(|x| + 1) - 1) + eps x`` (`shoal.losses.value.value_transform`):
``y = h(G + gamma^K h^-1(Q_target(s', argmax_a Q(s', a))))``. The target network is copied
every ``target_update_every`` updates.

Exploration anneals epsilon from ``epsilon_start`` to ``epsilon_end``; with ``run.runners``
> 0 the rollouts come from Ray runners (`shoal.collect.ray`) that share it. The paper's other
inputs to the LSTM (the previous action and reward) are left out.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, ClassVar

import gymnasium as gym
import torch

from shoal.algos.cores.checks import check_no_masks
from shoal.algos.cores.group_shares import SequenceShare
from shoal.algos.cores.learner_group import ReplayLearnerGroup
from shoal.algos.cores.metrics import mean_metrics
from shoal.algos.cores.on_policy import OnPolicyCore, held
from shoal.algos.spec import AlgorithmSpec
from shoal.config import EnvConfig, ModelConfig, OptimConfig, RunConfig, check, check_positive
from shoal.config.usage import CONSTANT_LR, OWN_GAMMA
from shoal.core.device import check_precision, resolve_device, to_device, to_host
from shoal.core.seeding import derive_seed
from shoal.data.segments import SequenceBatch, SequenceReplay
from shoal.data.sequences import SequenceBuilder
from shoal.fast.backend import place
from shoal.losses.sequence_q import sequence_n_step_targets, sequence_priorities
from shoal.losses.value import inverse_value_transform, value_transform
from shoal.nn.policy import ActorPolicy
from shoal.nn.recurrent_q import RecurrentQNetwork
from shoal.nn.target import frozen_copy, soft_update
from shoal.optim import build_optimizer, minimize
from shoal.optim.schedules import linear


@dataclass(frozen=True)
class SequenceReplayConfig:
    """R2D2's prioritized sequence replay."""

    buffer_size: int = 5_000
    """Sequences kept."""
    batch_size: int = 32
    """Sequences per gradient step."""
    learning_starts: int = 64
    """Sequences stored before the first gradient step."""
    gradient_steps: int = 1
    """Gradient steps per iteration."""
    priority_alpha: float = 0.9
    """Priority exponent (R2D2: 0.9; 0 samples uniformly)."""
    priority_beta: float = 0.6
    """Importance-sampling exponent (R2D2: 0.6, not annealed)."""
    priority_eta: float = 0.9
    """Sequence priority: eta max |delta| + (1 - eta) mean |delta|."""
    save: bool = False
    """Store the replay in checkpoints (exact resume; large files)."""

    def __post_init__(self) -> None:
        check_positive(self, "buffer_size", "batch_size", "gradient_steps")
        check(self, "learning_starts", self.learning_starts >= 0, "must be >= 0")
        check(self, "priority_alpha", self.priority_alpha >= 0, "must be >= 0")
        check(self, "priority_beta", 0.0 <= self.priority_beta <= 1.0, "must be in [0, 1]")
        check(self, "priority_eta", 0.0 <= self.priority_eta <= 1.0, "must be in [0, 1]")


@dataclass(frozen=True)
class R2D2Config:
    """R2D2 hyperparameters, scaled down from the paper's Atari settings (burn-in 40, length
    80, period 40, n = 5, gamma 0.997, Adam 1e-4, target every 2500 updates) to control
    tasks; the tuned examples hold tested settings."""

    run: RunConfig = field(default_factory=RunConfig)
    env: EnvConfig = field(default_factory=lambda: EnvConfig(num_envs=8))
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-3, max_grad_norm=10.0))
    model: ModelConfig = field(
        default_factory=lambda: ModelConfig(hidden=(64,), activation="relu", lstm_hidden=64)
    )
    replay: SequenceReplayConfig = field(default_factory=SequenceReplayConfig)
    num_steps: int = 16
    """Vector-env steps per iteration."""
    burn_in: int = 8
    """Steps at a sequence's start that only refresh the recurrent state (no loss)."""
    length: int = 16
    """Steps of a sequence that are learned, after the burn-in."""
    period: int = 8
    """Steps between the starts of consecutive sequences of an episode (< length: overlap)."""
    n_step: int = 5
    """Largest n of the n-step targets (cut at episode and sequence ends)."""
    gamma: float = 0.99
    """Discount factor."""
    value_rescaling: bool = True
    """Learn h(Q) with h(x) = sign(x)(sqrt(|x| + 1) - 1) + eps x instead of Q."""
    rescaling_eps: float = 1e-3
    """The eps of the value rescaling."""
    dueling: bool = True
    """Dueling Q head: V + A - mean(A)."""
    target_update_every: int = 500
    """Gradient steps between target-network copies."""
    epsilon_start: float = 1.0
    """Initial probability of a random action."""
    epsilon_end: float = 0.01
    """Final probability of a random action."""
    exploration_steps: int = 20_000
    """Env steps over which epsilon anneals linearly."""

    UNUSED: ClassVar[dict[str, str]] = {
        **OWN_GAMMA,
        **CONSTANT_LR,
        "model.shared_trunk": "its Q-network is one network",
    }

    def __post_init__(self) -> None:
        check_positive(self, "num_steps", "length", "period", "n_step", "target_update_every")
        check_positive(self, "exploration_steps", "rescaling_eps")
        check(self, "burn_in", self.burn_in >= 0, "must be >= 0")
        check(self, "period", self.period <= self.length, f"must be <= length = {self.length}")
        check(self, "gamma", 0.0 <= self.gamma <= 1.0, "must be in [0, 1]")
        for name in ("epsilon_start", "epsilon_end"):
            check(self, name, 0.0 <= getattr(self, name) <= 1.0, "must be in [0, 1]")
        check(
            self.model,
            "lstm_hidden",
            self.model.lstm_hidden is not None,
            "R2D2's Q-network is recurrent: set the LSTM's width",
        )
        check(self.model, "backend", self.model.backend != "numpy", "R2D2 trains through torch")
        batch = self.replay.batch_size  # a learner group splits each batch's sequences
        split = f"must be <= replay.batch_size ({batch}): each batch is split among the learners"
        check(self.run, "learners", self.run.learners <= batch, split)
        check_no_masks(self, "R2D2")


def build_model(config: R2D2Config, obs_space: gym.Space, action_space: gym.Space) -> Any:
    return RecurrentQNetwork(obs_space, action_space, config.model, config.dueling)


def time_major(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Replay's ``[N, T, ...]`` sequence fields as ``[T, N, ...]`` (``state`` stays
    ``[N, ...]``)."""
    return {k: v if k == "state" else v.transpose(0, 1) for k, v in batch.items()}


def sequence_td(
    online: RecurrentQNetwork,
    target: RecurrentQNetwork,
    batch: dict[str, torch.Tensor],
    config: R2D2Config,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(Q(s, a), TD errors, valid)``, each ``[L - burn_in, N]``, of a time-major batch of
    sequences (``obs [L + 1, N]``, transitions ``[L, N]``, ``state [N, 2, H]``): the online
    network runs from the stored state through the burn-in without gradient, then through the
    rest; targets are ``h(G + gamma^K h^-1(Q_target(s', argmax_a Q(s', a))))``. Actors score
    their sequences with it too, their one network standing in for the target."""
    burn, eps = config.burn_in, config.rescaling_eps
    rescale = config.value_rescaling
    obs, starts, state = batch["obs"], batch["starts"], batch["state"]
    with torch.no_grad():
        if burn:  # refresh the stored state; these steps carry no loss
            _, state = online(obs[:burn], state, starts[:burn])
        target_features, _ = target(obs, batch["state"], starts)
        target_q = target.q_values(target_features[burn:])
    features, _ = online(obs[burn:], state, starts[burn:])
    q = online.q_values(features)  # [L - burn + 1, N, A]
    valid = batch["valid"][burn:]
    with torch.no_grad():
        greedy = q.argmax(-1, keepdim=True)  # double Q: online picks, target evaluates
        bootstrap = target_q.gather(-1, greedy).squeeze(-1)
        if rescale:
            bootstrap = inverse_value_transform(bootstrap, eps)
        returns = sequence_n_step_targets(
            batch["rewards"][burn:], batch["terminated"][burn:], valid, bootstrap,
            config.gamma, config.n_step,
        )  # fmt: skip
        targets = value_transform(returns, eps) if rescale else returns
    actions = batch["actions"][burn:].long().unsqueeze(-1)
    q_taken = q[:-1].gather(-1, actions).squeeze(-1)
    return q_taken, targets - q_taken, valid


class R2D2Learner:
    """Online and target recurrent Q-networks, the optimizer, one update per batch."""

    def __init__(self, config: R2D2Config, obs_space: gym.Space, action_space: gym.Space):
        self.config = config
        self.device = resolve_device(config.run.device)
        check_precision(config.model.precision, self.device)
        online = build_model(config, obs_space, action_space)
        self.target = place(frozen_copy(online), self.device)
        self.model = place(online, self.device)
        self.parameters: list[torch.Tensor] = list(self.model.parameters())
        optim = config.optim
        self.optimizer = build_optimizer(
            self.parameters, "adamw", optim.lr, optim.eps, optim.weight_decay
        )
        self.minimize = minimize
        """The gradient step, a part: a learner group's rank swaps in one that all-reduces
        (`shoal.algos.cores.group_shares.SharedMinimize`)."""
        self.grad_steps = 0

    @property
    def policy_network(self) -> RecurrentQNetwork:
        return self.model

    def set_exploration(self, epsilon: float) -> None:
        """The actors' epsilon, a buffer of the weights they get."""
        self.model.epsilon.fill_(epsilon)

    def update(self, batch: SequenceBatch) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """One gradient step on replayed sequences; returns metrics and their new
        priorities ``[N]``."""
        cfg = self.config
        fields = to_device(time_major(batch.fields), self.device)
        q_taken, td, valid = sequence_td(self.model, self.target, fields, cfg)
        weights = batch.weights.to(self.device)
        count = valid.sum().clamp(min=1)
        loss = (weights.unsqueeze(0) * 0.5 * td.square() * valid).sum() / count
        norm = self.minimize({"td": loss}, self.optimizer, cfg.optim.max_grad_norm)
        self.grad_steps += 1
        if self.grad_steps % cfg.target_update_every == 0:
            soft_update(list(self.target.parameters()), self.parameters, 1.0)
        priorities = sequence_priorities(td.detach().abs(), valid, cfg.replay.priority_eta)
        metrics = {
            "loss/td": loss.detach(),
            "train/q_mean": (q_taken.detach() * valid).sum() / count,
        }
        if norm is not None:
            metrics["train/grad_norm"] = torch.as_tensor(norm)
        return metrics, priorities

    def get_weights(self) -> dict[str, torch.Tensor]:
        return to_host(self.model.state_dict())

    def set_weights(self, weights: dict[str, torch.Tensor]) -> None:
        self.model.load_state_dict(weights)

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "target": self.target.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "grad_steps": self.grad_steps,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.target.load_state_dict(state["target"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.grad_steps = state["grad_steps"]


class R2D2:
    """One R2D2 iteration: act, cut sequences into replay, learn, publish the weights."""

    env_steps = held("env_steps")
    iteration = held("iteration")
    learner = held("learner")
    sampler = held("sampler")

    def __init__(self, config: R2D2Config):
        self.config = config
        self.core = OnPolicyCore(
            self.config, R2D2Learner, build_model, "R2D2", takes_action_masks=False,
            # run.learners > 1: each learner takes some of every batch's sequences
            group=functools.partial(ReplayLearnerGroup, share_cls=SequenceShare),
        )  # fmt: skip
        self.core.broadcast(set_temperature=True)
        rows = self.sampler.num_envs * self.sampler.agents_per_env
        self.builder = SequenceBuilder(rows, config.burn_in, config.length, config.period)
        self.replay = SequenceReplay(
            config.replay.buffer_size,
            config.replay.priority_alpha,
            derive_seed(config.run.seed, "r2d2-replay"),
        )
        self._explore()

    def _explore(self) -> dict[str, float]:
        """Set the exploration of the next rollout and publish it with the weights."""
        cfg = self.config
        progress = self.env_steps / cfg.exploration_steps
        epsilon = linear(cfg.epsilon_start, cfg.epsilon_end, progress)
        self.learner.set_exploration(epsilon)
        self.core.publish(self.learner.get_weights())
        return {"train/epsilon": epsilon}

    def train_iteration(self) -> dict[str, float]:
        cfg = self.config
        rollout, episodes = self.core.sample()
        for sequence in self.builder.add(rollout):
            self.replay.add(sequence)
        rows = []
        if len(self.replay) >= max(cfg.replay.learning_starts, 1):
            for _ in range(cfg.replay.gradient_steps):
                batch = self.replay.sample(cfg.replay.batch_size, cfg.replay.priority_beta)
                metrics, priorities = self.learner.update(batch)
                self.replay.update_priorities(batch.indices, priorities.cpu().numpy())
                rows.append(metrics)
        metrics = mean_metrics(rows) if rows else {}
        metrics["train/sequences"] = len(self.replay)
        metrics.update(self._explore())
        if self.sampler.restarts:
            metrics["perf/sampler_restarts"] = self.sampler.restarts
        metrics.update(episodes.metrics())
        return metrics

    def state_dict(self) -> dict[str, Any]:
        state = self.core.state_dict()
        state["builder"] = self.builder.state_dict()
        state["replay"] = self.replay.state_dict() if self.config.replay.save else None
        return state

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        exact = self.core.load_state_dict(state)
        self.builder.load_state_dict(state["builder"])
        if state.get("replay") is not None:
            self.replay.load_state_dict(state["replay"])
        self._explore()
        return exact

    def policy(self) -> ActorPolicy:
        return self.core.policy()

    def close(self) -> None:
        self.core.close()


SPECS = (
    AlgorithmSpec(
        "r2d2",
        R2D2Config,
        R2D2,
        build_model,
        "R2D2: recurrent replay DQN (LSTM, burn-in, stored state, h-rescaled n-step double Q)",
        "Discrete",
        runners=True,
        learner_groups=True,
    ),
)
"""The names this module registers (`shoal.algos.spec`, `shoal.registry`)."""
