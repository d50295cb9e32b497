"""Deep Q-Networks with every Rainbow component as an independent switch.

DQN (Mnih et al. 2015), Double DQN (van Hasselt et al. 2016), dueling heads (Wang et al.
2016), prioritized replay (Schaul et al. 2016), n-step returns, noisy nets (Fortunato et al.
2018) and the distributional C51 head (Bellemare et al. 2017) are config fields; Rainbow
(Hessel et al. 2018) is a tuned example that switches them all on. QR-DQN (Dabney et al. 2018)
and REM (Agarwal et al. 2020) are the same learner with another value head and loss: the
value kinds of `shoal.nn.q_network`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import gymnasium as gym
import torch

from shoal.algos.cores.off_policy import ReplayAlgorithm
from shoal.algos.spec import AlgorithmSpec
from shoal.config import (
    REPLAY_RENAMES,
    EnvConfig,
    ModelConfig,
    OptimConfig,
    Renamed,
    ReplayConfig,
    RunConfig,
    check,
    check_choices,
    check_positive,
    check_replay_holds,
)
from shoal.config.usage import NO_LR_SCHEDULE, Gate
from shoal.core.device import (
    check_precision,
    grad_scaler,
    load_scaler_state,
    resolve_device,
    scaler_state,
    to_device,
    to_host,
)
from shoal.core.types import ReplayBatch
from shoal.fast.backend import place
from shoal.losses import bootstrap_discount, n_step_return
from shoal.losses.value_kinds import make_value_kind
from shoal.nn.q_network import QNetwork
from shoal.nn.target import frozen_copy, soft_update
from shoal.optim import build_optimizer, minimize
from shoal.optim.schedules import linear


@dataclass(frozen=True)
class DQNConfig:
    """DQN hyperparameters. Defaults are a plain Double DQN that learns CartPole-sized tasks;
    the tuned examples (dqn-cartpole, rainbow-cartpole, qrdqn-cartpole, rem-cartpole) hold
    tested settings."""

    run: RunConfig = field(default_factory=RunConfig)
    env: EnvConfig = field(default_factory=lambda: EnvConfig(num_envs=4))
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=5e-4, max_grad_norm=10.0))
    model: ModelConfig = field(
        default_factory=lambda: ModelConfig(hidden=(128, 128), activation="relu")
    )
    value_head: Literal["q", "c51", "quantile", "rem"] = "q"
    """q: one Q-value per action (DQN); c51: categorical return distribution; quantile:
    QR-DQN quantiles; rem: random ensemble mixture of num_heads Q-heads."""
    double_q: bool = True
    """Choose the bootstrap action with the online network, evaluate it with the target."""
    dueling: bool = False
    """Separate value and advantage streams, combined as V + A - mean(A)."""
    head_hidden: int | None = None
    """Hidden layer size inside the head's streams (None: linear streams)."""
    noisy: bool = False
    """Factorized-Gaussian noisy linear layers in the head (exploration by parameter noise)."""
    noisy_sigma0: float = 0.5
    """Initial noise scale of noisy layers."""
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    """Replay size, batch size, n-step returns, prioritization, learning_starts (env steps of
    pure exploration before the first gradient step), gradient steps per iteration."""
    num_atoms: int = 51
    """Support size of the C51 distribution."""
    v_min: float = -10.0
    """Lower end of the C51 support."""
    v_max: float = 10.0
    """Upper end of the C51 support."""
    num_quantiles: int = 50
    """Quantiles of the QR-DQN head."""
    kappa: float = 1.0
    """Huber threshold of the quantile regression loss."""
    num_heads: int = 4
    """Q-heads of REM."""
    rollout_steps: int = 1
    """Vector-env steps per iteration (env steps per iteration = rollout_steps * num_envs)."""
    target_update_every: int = 500
    """Gradient steps between target-network updates."""
    tau: float = 1.0
    """Target update: target <- tau * online + (1 - tau) * target (1: hard copy)."""
    loss: Literal["huber", "mse"] = "huber"
    """TD loss of the q and rem heads."""
    gamma: float = 0.99
    """Discount factor."""
    exploration: Literal["epsilon", "boltzmann"] = "epsilon"
    """epsilon-greedy, or sampling from softmax(Q / temperature)."""
    epsilon_start: float = 1.0
    """Initial probability of a uniformly random action."""
    epsilon_end: float = 0.05
    """Final probability of a random action."""
    temperature_start: float = 1.0
    """Initial Boltzmann temperature."""
    temperature_end: float = 0.01
    """Final Boltzmann temperature."""
    exploration_steps: int = 10_000
    """Env steps over which epsilon / temperature anneal linearly to their final value."""
    frame_replay: bool = False
    """Store frame-stacked image observations [k, H, W] (stacked on the first axis, e.g.
    Atari's 4 x 84 x 84) one frame per step in replay and rebuild the stacks when sampling
    (`shoal.data.frame_replay`): about 7 KB per Atari transition instead of 28 KB."""

    RENAMED: ClassVar[dict[str, Renamed]] = REPLAY_RENAMES

    GATES: ClassVar[dict[str, Gate]] = {
        **{name: Gate("value_head", lambda h: h == "c51", "with value_head c51")
           for name in ("num_atoms", "v_min", "v_max")},
        **{name: Gate("value_head", lambda h: h == "quantile", "with value_head quantile")
           for name in ("num_quantiles", "kappa")},
        "num_heads": Gate("value_head", lambda h: h == "rem", "with value_head rem"),
        "loss": Gate("value_head", lambda h: h in ("q", "rem"), "with value_head q or rem "
                     "(c51 and quantile heads have their own losses)"),
        "noisy_sigma0": Gate("noisy", bool, "with noisy nets (noisy)"),
        **{name: Gate("exploration", lambda e: e == "epsilon", "with exploration epsilon")
           for name in ("epsilon_start", "epsilon_end")},
        **{name: Gate("exploration", lambda e: e == "boltzmann", "with exploration boltzmann")
           for name in ("temperature_start", "temperature_end")},
    }  # fmt: skip
    UNUSED: ClassVar[dict[str, str]] = {
        **NO_LR_SCHEDULE,
        "model.shared_trunk": "its Q-network is one network",
        "model.lstm_hidden": "its Q-network has no recurrent core (R2D2's has)",
    }

    def __post_init__(self) -> None:
        check_choices(self)
        check_positive(self, "rollout_steps", "target_update_every", "exploration_steps")
        check_positive(self, "num_atoms", "num_quantiles", "num_heads", "kappa")
        check_positive(self, "temperature_start", "temperature_end", "noisy_sigma0")
        check(self, "gamma", 0.0 <= self.gamma <= 1.0, "must be in [0, 1]")
        check(self, "tau", 0.0 < self.tau <= 1.0, "must be in (0, 1]")
        for name in ("epsilon_start", "epsilon_end"):
            check(self, name, 0.0 <= getattr(self, name) <= 1.0, "must be in [0, 1]")
        check(self, "v_max", self.v_max > self.v_min, f"must be > v_min = {self.v_min}")
        check(self, "num_atoms", self.num_atoms >= 2 or self.value_head != "c51", "must be >= 2")
        check_replay_holds(self, self.env.num_envs)


def build_model(config: DQNConfig, obs_space: gym.Space, action_space: gym.Space) -> QNetwork:
    return QNetwork(obs_space, action_space, config, make_value_kind(config))


class DQNLearner:
    """Online and target Q-networks, the optimizer, and one gradient step on a replay batch."""

    def __init__(self, config: DQNConfig, obs_space: gym.Space, action_space: gym.Space):
        self.config = config
        self.device = resolve_device(config.run.device)
        check_precision(config.model.precision, self.device)
        online = build_model(config, obs_space, action_space)
        self.target = place(frozen_copy(online), self.device, config.run.compile)
        self.online = place(online, self.device, config.run.compile)
        self.kind = self.online.kind
        self.parameters: list[torch.Tensor] = list(self.online.parameters())
        optim = config.optim
        self.optimizer = build_optimizer(
            self.parameters, "adamw", optim.lr, optim.eps, optim.weight_decay
        )
        self.scaler = grad_scaler(config.model.precision, self.device)
        self.minimize = minimize
        """The gradient step, a part: a learner group's rank swaps in one that all-reduces
        (`shoal.algos.cores.group_shares.SharedMinimize`)."""
        self.grad_steps = 0

    def update(self, batch: ReplayBatch) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """One gradient step; returns metrics (tensors) and new priorities ``[N]``."""
        cfg = self.config
        batch = to_device(batch, self.device)
        if cfg.noisy:  # fresh parameter noise for every step, online and target alike
            self.online.reset_noise()
            self.target.reset_noise()
        n = batch.obs.shape[0]
        returns = n_step_return(batch.rewards, cfg.gamma)
        discounts = bootstrap_discount(batch.steps, batch.terminated, cfg.gamma)
        if cfg.double_q:  # one forward pass over both observation batches
            out, next_online = self.online(torch.cat([batch.obs, batch.next_obs])).split(n)
        else:
            out, next_online = self.online(batch.obs), None
        with torch.no_grad():
            next_target = self.target(batch.next_obs)
        out_taken = out[torch.arange(n, device=out.device), batch.actions.long()]
        loss, priorities = self.kind.loss(
            out_taken, next_target, next_online, returns, discounts, batch
        )
        self.minimize({"td": loss}, self.optimizer, cfg.optim.max_grad_norm, scaler=self.scaler)
        self.grad_steps += 1
        if self.grad_steps % cfg.target_update_every == 0:
            self._update_target()
        q_taken = self.kind.q_values(out_taken.detach().unsqueeze(1)).squeeze(1)
        return {"loss/td": loss.detach(), "train/q_mean": q_taken.mean()}, priorities

    def _update_target(self) -> None:
        soft_update(list(self.target.parameters()), self.parameters, self.config.tau)

    @property
    def policy_network(self) -> QNetwork:
        return self.online

    def set_exploration(self, epsilon: float, temperature: float) -> None:
        self.online.epsilon.fill_(epsilon)
        self.online.temperature.fill_(temperature)

    def get_weights(self) -> dict[str, torch.Tensor]:
        return to_host(self.online.state_dict())

    def set_weights(self, weights: dict[str, torch.Tensor]) -> None:
        self.online.load_state_dict(weights)

    def state_dict(self) -> dict[str, Any]:
        return {
            "online": self.online.state_dict(),
            "target": self.target.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "grad_steps": self.grad_steps,
            **scaler_state(self.scaler),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.online.load_state_dict(state["online"])
        self.target.load_state_dict(state["target"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.grad_steps = int(state["grad_steps"])
        load_scaler_state(self.scaler, state)


def annealed_exploration(learner: DQNLearner, config: DQNConfig, env_steps: int) -> dict:
    """DQN's exploration (`shoal.algos.cores.off_policy.Exploration`): epsilon (and the
    Boltzmann temperature) annealed linearly over ``exploration_steps`` env steps."""
    explore = min(1.0, env_steps / config.exploration_steps)
    epsilon = linear(config.epsilon_start, config.epsilon_end, explore)
    temperature = linear(config.temperature_start, config.temperature_end, explore)
    learner.set_exploration(epsilon, temperature)
    metrics = {"train/epsilon": epsilon}
    if config.exploration == "boltzmann":
        metrics["train/temperature"] = temperature
    return metrics


class DQN(ReplayAlgorithm):
    """One iteration: act for ``rollout_steps`` vector steps with annealed exploration, store
    them, learn from replay: `ReplayAlgorithm` with DQN's learner and exploration."""

    def __init__(self, config: DQNConfig):
        super().__init__(config, DQNLearner, build_model, annealed_exploration,
                         frame_replay=config.frame_replay)  # fmt: skip


# One learner, three names for its value heads.
SPECS = (
    AlgorithmSpec(
        "dqn",
        DQNConfig,
        DQN,
        build_model,
        "DQN with switches for every Rainbow part (double, dueling, n-step, PER, noisy, C51)",
        "Discrete",
        runners=True,
        learner_groups=True,
    ),
    AlgorithmSpec(
        "qrdqn",
        DQNConfig,
        DQN,
        build_model,
        "QR-DQN: distributional DQN by quantile regression",
        "Discrete",
        {"value_head": "quantile"},
        runners=True,
        learner_groups=True,
    ),
    AlgorithmSpec(
        "rem",
        DQNConfig,
        DQN,
        build_model,
        "REM: DQN with a random convex mixture of Q-heads",
        "Discrete",
        {"value_head": "rem"},
        runners=True,
        learner_groups=True,
    ),
)
"""The names this module registers (`shoal.algos.spec`, `shoal.registry`)."""
