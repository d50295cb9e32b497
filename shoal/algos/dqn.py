"""Deep Q-Networks with every Rainbow component as an independent switch.

DQN (Mnih et al. 2015), Double DQN (van Hasselt et al. 2016), dueling heads (Wang et al.
2016), prioritized replay (Schaul et al. 2016), n-step returns, noisy nets (Fortunato et al.
2018) and the distributional C51 head (Bellemare et al. 2017) are config fields; Rainbow
(Hessel et al. 2018) is a tuned example that switches them all on. QR-DQN (Dabney et al. 2018)
and REM (Agarwal et al. 2020) are the same learner with another value head and loss: the
value kinds of `shoal.nn.q_network`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Literal

import gymnasium as gym
import torch

from shoal.collect import EnvRunner, LocalSampler
from shoal.config import (
    EnvConfig,
    ModelConfig,
    OptimConfig,
    RunConfig,
    check,
    check_choices,
    check_positive,
)
from shoal.data.prioritized import Priorities, ProportionalPriorities, RankBasedPriorities
from shoal.data.replay import ReplayBuffer
from shoal.errors import NaNLossError
from shoal.losses import bootstrap_discount, n_step_return
from shoal.nn.q_network import QNetwork, make_value_kind
from shoal.policy import ActorPolicy
from shoal.train.schedules import linear
from shoal.train.seeding import derive_seed
from shoal.types import ReplayBatch


@dataclass(frozen=True)
class DQNConfig:
    """DQN hyperparameters. Defaults are a plain Double DQN that learns CartPole-sized tasks;
    the tuned examples (dqn-cartpole, rainbow-cartpole, qrdqn-cartpole) hold tested settings."""

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
    n_step: int = 1
    """Bootstrap after n rewards (stopping at episode ends)."""
    replay: Literal["uniform", "proportional", "rank"] = "uniform"
    """Replay sampling: uniform, or prioritized by TD error (proportional or rank-based)."""
    buffer_size: int = 100_000
    """Replay capacity in transitions."""
    priority_alpha: float = 0.6
    """How strongly priorities skew sampling (0: uniform)."""
    priority_beta: float = 0.4
    """Importance-weight exponent at the start, annealed linearly to 1."""
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
    batch_size: int = 64
    """Transitions per gradient step."""
    learning_starts: int = 1_000
    """Env steps of pure exploration before the first gradient step."""
    rollout_steps: int = 1
    """Vector-env steps per iteration (env steps per iteration = rollout_steps * num_envs)."""
    gradient_steps: int = 1
    """Gradient steps per iteration: updates per env step = gradient_steps / env steps."""
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
    save_replay: bool = False
    """Store the replay buffer in checkpoints (exact resume; large files)."""

    def __post_init__(self) -> None:
        check_choices(self)
        check_positive(self, "n_step", "buffer_size", "batch_size", "rollout_steps")
        check_positive(self, "gradient_steps", "target_update_every", "exploration_steps")
        check_positive(self, "num_atoms", "num_quantiles", "num_heads", "kappa")
        check_positive(self, "temperature_start", "temperature_end", "noisy_sigma0")
        check(self, "gamma", 0.0 <= self.gamma <= 1.0, "must be in [0, 1]")
        check(self, "tau", 0.0 < self.tau <= 1.0, "must be in (0, 1]")
        check(self, "learning_starts", self.learning_starts >= 0, "must be >= 0")
        check(self, "priority_alpha", self.priority_alpha >= 0, "must be >= 0")
        check(self, "priority_beta", 0.0 <= self.priority_beta <= 1.0, "must be in [0, 1]")
        for name in ("epsilon_start", "epsilon_end"):
            check(self, name, 0.0 <= getattr(self, name) <= 1.0, "must be in [0, 1]")
        check(self, "v_max", self.v_max > self.v_min, f"must be > v_min = {self.v_min}")
        check(self, "num_atoms", self.num_atoms >= 2 or self.value_head != "c51", "must be >= 2")
        check(
            self,
            "buffer_size",
            self.buffer_size >= self.env.num_envs * (self.n_step + 2),
            f"must hold at least n_step + 2 steps of {self.env.num_envs} envs",
        )


def build_model(config: DQNConfig, obs_space: gym.Space, action_space: gym.Space) -> QNetwork:
    return QNetwork(obs_space, action_space, config, make_value_kind(config))


def make_priorities(config: DQNConfig, num_envs: int) -> Priorities | None:
    """The replay's priority structure, over the buffer's whole rows of ``num_envs``."""
    capacity = -(-config.buffer_size // num_envs) * num_envs
    if config.replay == "proportional":
        return ProportionalPriorities(capacity, config.priority_alpha)
    if config.replay == "rank":
        return RankBasedPriorities(capacity, config.priority_alpha)
    return None


class DQNLearner:
    """Online and target Q-networks, the optimizer, and one gradient step on a replay batch."""

    def __init__(self, config: DQNConfig, obs_space: gym.Space, action_space: gym.Space):
        self.config = config
        self.online = build_model(config, obs_space, action_space)
        self.target = copy.deepcopy(self.online).requires_grad_(False)
        self.kind = self.online.kind
        self.parameters = list(self.online.parameters())
        optim = config.optim
        self.optimizer = torch.optim.AdamW(
            self.parameters,
            lr=optim.lr,
            eps=optim.eps,
            weight_decay=optim.weight_decay,
            fused=True,  # one kernel for all parameters: most of a small network's step
        )
        self.grad_steps = 0

    def update(self, batch: ReplayBatch) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """One gradient step; returns metrics (tensors) and new priorities ``[N]``."""
        cfg = self.config
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
        out_taken = out[torch.arange(n), batch.actions.long()]
        loss, priorities = self.kind.loss(
            out_taken, next_target, next_online, returns, discounts, batch
        )
        if not torch.isfinite(loss):
            raise NaNLossError(f"loss/td became {loss.item()}; weights left unchanged")
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.optim.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(self.parameters, cfg.optim.max_grad_norm, foreach=True)
        self.optimizer.step()
        self.grad_steps += 1
        if self.grad_steps % cfg.target_update_every == 0:
            self._update_target()
        q_taken = self.kind.q_values(out_taken.detach().unsqueeze(1)).squeeze(1)
        return {"loss/td": loss.detach(), "train/q_mean": q_taken.mean()}, priorities

    @torch.no_grad()
    def _update_target(self) -> None:
        if self.config.tau == 1.0:
            self.target.load_state_dict(self.online.state_dict())
            return
        pairs = zip(self.target.parameters(), self.online.parameters(), strict=True)
        for target, online in pairs:
            target.lerp_(online, self.config.tau)

    def set_exploration(self, epsilon: float, temperature: float) -> None:
        self.online.epsilon.fill_(epsilon)
        self.online.temperature.fill_(temperature)

    def get_weights(self) -> dict[str, torch.Tensor]:
        return self.online.state_dict()

    def set_weights(self, weights: dict[str, torch.Tensor]) -> None:
        self.online.load_state_dict(weights)

    def state_dict(self) -> dict[str, Any]:
        return {
            "online": self.online.state_dict(),
            "target": self.target.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "grad_steps": self.grad_steps,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.online.load_state_dict(state["online"])
        self.target.load_state_dict(state["target"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.grad_steps = int(state["grad_steps"])


class DQN:
    """One iteration: act for ``rollout_steps`` vector steps, store them, learn from replay."""

    def __init__(self, config: DQNConfig):
        self.config = config
        runner = EnvRunner(
            config.env,
            lambda obs_space, action_space: build_model(config, obs_space, action_space),
            config.rollout_steps,
            seed=derive_seed(config.run.seed, "env", 0),
        )
        self.sampler = LocalSampler(runner)
        env = runner.env
        self.learner = DQNLearner(config, env.observation_space, env.action_space)
        mask_dim = None if env.action_mask is None else int(env.action_space.n)
        self.replay = ReplayBuffer(
            config.buffer_size,
            env.num_envs,
            env.observation_space,
            env.action_space,
            n_step=config.n_step,
            action_mask_dim=mask_dim,
            priorities=make_priorities(config, env.num_envs),
            seed=derive_seed(config.run.seed, "replay", 0),
        )
        self.env_steps = 0
        self.iteration = 0

    def _progress(self, horizon: int) -> float:
        return min(1.0, self.env_steps / horizon)

    def train_iteration(self) -> dict[str, float]:
        cfg = self.config
        explore = self._progress(cfg.exploration_steps)
        epsilon = linear(cfg.epsilon_start, cfg.epsilon_end, explore)
        temperature = linear(cfg.temperature_start, cfg.temperature_end, explore)
        self.learner.set_exploration(epsilon, temperature)
        self.sampler.set_weights(self.learner.get_weights())
        rollout, episodes = self.sampler.sample()
        self.replay.extend(
            rollout.obs.numpy(),
            rollout.actions.numpy(),
            rollout.rewards.numpy(),
            rollout.terminated.numpy(),
            rollout.truncated.numpy(),
            rollout.valid.numpy(),
            None if rollout.action_mask is None else rollout.action_mask.numpy(),
        )
        self.env_steps += rollout.rewards.numel()
        self.iteration += 1
        metrics: dict[str, float] = {"train/epsilon": epsilon}
        if cfg.exploration == "boltzmann":
            metrics["train/temperature"] = temperature
        if self.env_steps > cfg.learning_starts and self.replay.num_sampleable() > 0:
            metrics.update(self._learn())
        metrics.update(episodes.metrics())
        return metrics

    def _learn(self) -> dict[str, float]:
        cfg = self.config
        anneal = cfg.optim.anneal_steps or cfg.run.total_steps
        beta = cfg.priority_beta + (1.0 - cfg.priority_beta) * self._progress(anneal)
        history = []
        for _ in range(cfg.gradient_steps):
            batch = self.replay.sample(cfg.batch_size, beta)
            stats, priorities = self.learner.update(batch)
            if cfg.replay != "uniform":
                self.replay.update_priorities(batch.indices, priorities.numpy())
            history.append(torch.stack(list(stats.values())))
        means = torch.stack(history).mean(0).tolist()
        metrics = dict(zip(stats, means, strict=True))
        metrics["train/grad_steps"] = self.learner.grad_steps
        if cfg.replay != "uniform":
            metrics["train/beta"] = beta
        return metrics

    def policy(self) -> ActorPolicy:
        return ActorPolicy(
            copy.deepcopy(self.learner.online), self.sampler.obs_stats(), self.config.env.clip_obs
        )

    def state_dict(self) -> dict[str, Any]:
        return {
            "learner": self.learner.state_dict(),
            "sampler": self.sampler.get_state(),
            "replay": self.replay.state_dict() if self.config.save_replay else None,
            "policy": {
                "model": self.learner.online.state_dict(),
                "obs_stats": self.sampler.obs_stats(),
            },
            "counters": {"env_steps": self.env_steps, "iteration": self.iteration},
        }

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        """Restore; returns False when envs restarted (or the replay was not saved)."""
        self.learner.load_state_dict(state["learner"])
        self.sampler.set_weights(self.learner.get_weights())
        self.env_steps = state["counters"]["env_steps"]
        self.iteration = state["counters"]["iteration"]
        replay_restored = state.get("replay") is not None
        if replay_restored:
            self.replay.load_state_dict(state["replay"])
        fallback = derive_seed(self.config.run.seed, "env-restart", self.iteration)
        return self.sampler.set_state(state["sampler"], fallback) and replay_restored

    def close(self) -> None:
        self.sampler.close()
