"""QMIX, VDN and IQL: cooperative multi-agent Q-learning with a shared recurrent agent network
and a value-decomposition mixer, trained on whole episodes from an episode replay.

QMIX (Rashid et al. 2018) mixes the agents' Q-values with a monotonic, state-conditioned
hypernetwork mixer; VDN (Sunehag et al. 2018) sums them; IQL (``mixer: none``, Tan 1993 with
recurrent agents) learns each agent's Q-values from its own TD error. Settings follow
pymarl / RLlib's QMIX (its 2018 algorithm documentation): double Q, RMSProp (lr 5e-4, alpha
0.99, eps 1e-5), gradient clipping 10, batches of whole episodes, hard target updates, linear
epsilon decay.

Training acts on the multi-agent vector env directly (``[B, N, ...]`` arrays); the deployed
policy (`RecurrentQPolicy`) acts on the rows of `shoal.envs.agents_as_batch.AgentsAsBatch`
(one row per (env, agent), agent one-hot appended with ``env.agent_id``), as evaluation and
``shoal.load`` see the env.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from shoal.algos.multi_agent.qmix_acting import agent_inputs, build_acting, build_runner, team_group
from shoal.algos.multi_agent.qmix_group import QMIXLearnerGroup
from shoal.algos.spec import AlgorithmSpec
from shoal.collect.multi_agent import MultiAgentRunner
from shoal.collect.multi_agent_ray import MultiAgentSampler, runners_for
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
    check_multi_agent_learner,
    check_positive,
)
from shoal.config.usage import CONSTANT_LR, IN_STEP, Gate
from shoal.core.device import check_precision, resolve_device, to_device
from shoal.core.errors import UnsupportedSpaceError
from shoal.core.seeding import derive_seed
from shoal.data.episode_replay import EpisodeBatch, EpisodeBuilder, EpisodeReplay
from shoal.envs.make import make_multi_agent_env
from shoal.envs.shapes import shape_of
from shoal.fast.backend import place, uncompiled_copy
from shoal.losses.value_decomposition import double_q_next_values, masked_td_loss, td_targets
from shoal.nn.mixers import QMixer, RecurrentAgent, RecurrentQPolicy, VDNMixer
from shoal.nn.policy import ActorPolicy
from shoal.nn.target import frozen_copy, soft_update
from shoal.optim import build_optimizer, check_finite_metrics, minimize
from shoal.optim.schedules import linear


@dataclass(frozen=True)
class QMIXConfig:
    """QMIX / VDN / IQL hyperparameters; defaults follow pymarl's QMIX (as RLlib's 2018
    documentation gives them)."""

    run: RunConfig = field(default_factory=RunConfig)
    env: EnvConfig = field(
        default_factory=lambda: EnvConfig(id="shoal/two-step-v0", num_envs=8, agent_id=True)
    )
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=5e-4, max_grad_norm=10.0))
    """lr, eps (RMSProp's or Adam's epsilon) and max_grad_norm (clip of the global norm)."""
    model: ModelConfig = field(default_factory=lambda: ModelConfig(hidden=(64,), activation="relu"))
    """hidden: the MLP layers before the agent's GRU cell; activation: theirs."""
    mixer: Literal["qmix", "vdn", "none"] = "qmix"
    """qmix: monotonic hypernetwork mixer on the global state; vdn: sum; none: IQL."""
    rnn_hidden: int = 64
    """Size of the agent network's GRU state."""
    mixing_embed_dim: int = 32
    """Hidden units of the QMIX mixing network."""
    hypernet_layers: Literal[1, 2] = 1
    """Layers of the hypernetworks that produce the mixing weights."""
    hypernet_embed: int = 64
    """Hidden units of two-layer weight hypernetworks."""
    last_action: bool = False
    """Append the agent's previous action (one-hot) to its network input."""
    double_q: bool = True
    """Choose bootstrap actions with the online agents, evaluate them with the target."""
    iql_reward: Literal["team", "own"] = "team"
    """IQL's per-agent reward: the team reward, or each agent's own reward."""
    gamma: float = 0.99
    """Discount factor."""
    replay: ReplayConfig = field(
        default_factory=lambda: ReplayConfig(buffer_size=5000, batch_size=32, learning_starts=32)
    )
    """Episode replay: buffer_size and batch_size count episodes, learning_starts the episodes
    stored before the first gradient step (at least batch_size are needed); uniform sampling,
    one-step targets (n_step 1, prioritized none)."""
    episode_limit: int = 100
    """Longest stored episode in steps; longer episodes are stored as cut pieces."""
    rollout_steps: int = 8
    """Vector-env steps per iteration (env steps per iteration = rollout_steps * num_envs)."""
    target_update_every: int = 200
    """Gradient steps between hard target-network updates."""
    optimizer: Literal["rmsprop", "adam"] = "rmsprop"
    """RMSProp (pymarl) or Adam."""
    optim_alpha: float = 0.99
    """RMSProp smoothing constant."""
    epsilon_start: float = 1.0
    """Initial probability of a uniformly random (legal) action, per agent."""
    epsilon_end: float = 0.01
    """Final probability of a random action."""
    exploration_steps: int = 50_000
    """Env steps over which epsilon anneals linearly."""

    RENAMED: ClassVar[dict[str, Renamed]] = REPLAY_RENAMES

    GATES: ClassVar[dict[str, Gate]] = {
        "iql_reward": Gate("mixer", lambda m: m == "none", "with mixer none (IQL)"),
        **{name: Gate("mixer", lambda m: m == "qmix", "with mixer qmix")
           for name in ("mixing_embed_dim", "hypernet_layers", "hypernet_embed")},
    }  # fmt: skip
    UNUSED: ClassVar[dict[str, str]] = {
        **CONSTANT_LR,
        "optim.weight_decay": "its optimizer (optimizer, optim_alpha) has no weight decay",
        "model.shared_trunk": "its agents share one network",
        "model.lstm_hidden": "its agents' recurrent core is the GRU of rnn_hidden",
        "model.encoder": "its agent networks read flat observations through MLPs",
        "replay.n_step": "it learns from 1-step targets over whole episodes",
        "replay.prioritized": "its episode replay samples uniformly",
        **IN_STEP,
    }

    def __post_init__(self) -> None:
        check_choices(self)
        check_positive(self, "rnn_hidden", "mixing_embed_dim", "hypernet_embed")
        check_multi_agent_learner(self, "QMIX", opponents=True)
        check_positive(self, "episode_limit", "rollout_steps")
        check_positive(self, "target_update_every", "exploration_steps")
        check(self, "gamma", 0.0 <= self.gamma <= 1.0, "must be in [0, 1]")
        check(self, "optim_alpha", 0.0 <= self.optim_alpha < 1.0, "must be in [0, 1)")
        for name in ("epsilon_start", "epsilon_end"):
            check(self, name, 0.0 <= getattr(self, name) <= 1.0, "must be in [0, 1]")
        replay = self.replay
        check(
            replay,
            "buffer_size",
            replay.buffer_size >= replay.batch_size,
            f"must hold at least replay.batch_size = {replay.batch_size} episodes",
        )
        check(replay, "n_step", replay.n_step == 1, "qmix/vdn/iql learn one-step targets: use 1")
        check(replay, "prioritized", replay.prioritized == "none", "qmix/vdn/iql need 'none'")
        split = f"must be <= replay.batch_size ({replay.batch_size}): each batch's episodes are "
        check(self.run, "learners", self.run.learners <= replay.batch_size, split + "split")
        env = self.env
        check(env, "normalize_obs", not env.normalize_obs, "not supported by qmix/vdn/iql")
        check(env, "normalize_reward", not env.normalize_reward, "not supported by qmix/vdn/iql")


class QMIXNetworks(nn.Module):
    """The shared agent network and the mixer (None for IQL)."""

    def __init__(
        self, config: QMIXConfig, in_dim: int, num_actions: int, n_agents: int, state_dim: int
    ):
        super().__init__()
        cfg = config
        self.agent = RecurrentAgent(
            in_dim, cfg.model.hidden, cfg.rnn_hidden, num_actions, cfg.model.activation
        )
        self.mixer: nn.Module | None = None
        if cfg.mixer == "vdn":
            self.mixer = VDNMixer()
        elif cfg.mixer == "qmix":
            self.mixer = QMixer(
                n_agents, state_dim, cfg.mixing_embed_dim, cfg.hypernet_layers, cfg.hypernet_embed
            )


def _extra_inputs(config: QMIXConfig, num_actions: int) -> int:
    return num_actions if config.last_action else 0


def build_model(
    config: QMIXConfig, obs_space: gym.Space, action_space: gym.Space
) -> RecurrentQPolicy:
    """The deployable `RecurrentQPolicy` for `AgentsAsBatch` rows (``obs_space`` of one row)."""
    if not isinstance(action_space, gym.spaces.Discrete):
        raise UnsupportedSpaceError(f"qmix/vdn/iql need Discrete actions, got {action_space}")
    num_actions = int(action_space.n)
    in_dim = int(np.prod(shape_of(obs_space))) + _extra_inputs(config, num_actions)
    agent = RecurrentAgent(
        in_dim, config.model.hidden, config.rnn_hidden, num_actions, config.model.activation
    )
    return RecurrentQPolicy(agent, config.last_action, config.epsilon_end)


class QMIXLearner:
    """Online and target networks, the optimizer, and one gradient step on an episode batch."""

    def __init__(
        self, config: QMIXConfig, in_dim: int, num_actions: int, n_agents: int, state_dim: int
    ):
        self.config = config
        self.device = resolve_device(config.run.device)
        check_precision(config.model.precision, self.device)
        online = QMIXNetworks(config, in_dim, num_actions, n_agents, state_dim)
        self.target = place(frozen_copy(online), self.device, config.run.compile)
        self.online = place(online, self.device, config.run.compile)
        self.parameters: list[torch.Tensor] = list(self.online.parameters())
        optim = config.optim
        self.optimizer = build_optimizer(
            self.parameters, config.optimizer, optim.lr, optim.eps, alpha=config.optim_alpha
        )
        self.num_actions, self.grad_steps = num_actions, 0
        self.minimize = minimize
        """The gradient step, a part: a learner group's rank swaps in one that all-reduces
        (`shoal.algos.cores.group_shares.SharedMinimize`)."""

    def loss_mask(self, batch: EpisodeBatch) -> torch.Tensor:
        """What the TD loss averages over: the real transitions ``[T, B]``, and for IQL (no
        mixer) the agents that acted on them ``[T, B, N]``."""
        if self.online.mixer is not None:
            return batch.filled
        return batch.filled.unsqueeze(-1) & batch.active

    def update(self, batch: EpisodeBatch, inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        """One gradient step; ``inputs`` ``[T + 1, B, N, in_dim]`` are the agent inputs."""
        cfg = self.config
        steps, b, n = batch.actions.shape
        flat = inputs.reshape(steps + 1, b * n, -1)
        q = self.online.agent.unroll(flat).view(steps + 1, b, n, -1)
        with torch.no_grad():
            q_target = self.target.agent.unroll(flat).view(steps + 1, b, n, -1)
        q_taken = q[:-1].gather(-1, batch.actions.unsqueeze(-1)).squeeze(-1)
        mask = None if batch.action_mask is None else batch.action_mask[1:]
        next_values = double_q_next_values(q[1:], q_target[1:], mask, cfg.double_q)
        mixer, target_mixer = self.online.mixer, self.target.mixer
        if mixer is not None and target_mixer is not None:
            q_tot = mixer(q_taken, batch.state[:-1])
            with torch.no_grad():
                next_tot = target_mixer(next_values, batch.state[1:])
            rewards = batch.rewards.mean(-1)
        else:  # IQL: one TD error per active agent
            q_tot, next_tot = q_taken, next_values
            rewards = batch.rewards
            if cfg.iql_reward == "team":
                rewards = rewards.mean(-1, keepdim=True).expand_as(q_taken)
        valid = self.loss_mask(batch)
        targets = td_targets(rewards, batch.terminated, next_tot, cfg.gamma)
        loss, metrics = masked_td_loss(q_tot, targets, valid)
        self.minimize({"td": loss}, self.optimizer, cfg.optim.max_grad_norm)
        self.grad_steps += 1
        if self.grad_steps % cfg.target_update_every == 0:
            soft_update(list(self.target.parameters()), self.parameters, 1.0)
        weight = valid.to(q_tot.dtype)
        metrics["train/q_tot_mean"] = (q_tot.detach() * weight).sum() / weight.sum().clamp_min(1)
        return metrics

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


class QMIX:
    """One iteration: act epsilon-greedily for ``rollout_steps`` vector steps (a
    `MultiAgentRunner`, in-process or on ``run.runners`` Ray actors whose envs are joined
    along the env axis), store finished episodes, then take ``gradient_steps`` gradient steps
    on batches of whole episodes. ``env_steps`` counts world steps (one per env per vector
    step), not agent steps."""

    def __init__(self, config: QMIXConfig):
        self.config = cfg = config
        env = make_multi_agent_env(cfg.env)
        self.group = team_group(env, cfg)
        self.agent_inputs = inputs = agent_inputs(cfg, env, self.group)
        n_agents, num_actions = inputs.n_agents, inputs.num_actions
        state_dim = 0 if env.state_space is None else int(np.prod(shape_of(env.state_space)))
        sizes = (inputs.size, num_actions, n_agents, state_dim)
        self.learner: QMIXLearner | QMIXLearnerGroup
        if cfg.run.learners == 1:
            self.learner = QMIXLearner(cfg, *sizes)
        else:  # each batch's episodes split among data-parallel copies on Ray actors
            self.learner = QMIXLearnerGroup(QMIXLearner, cfg, *sizes)
        mask_dim = num_actions if getattr(env, "action_mask", None) is not None else None
        self.replay = EpisodeReplay(
            cfg.replay.buffer_size,
            cfg.episode_limit,
            n_agents,
            inputs.obs_shape,
            state_dim,
            mask_dim,
            seed=derive_seed(cfg.run.seed, "replay", 0),
        )
        # Acting runs on the CPU: in-process, the learner's agent network there, or a copy
        # synchronized every iteration where the learner computes elsewhere (a GPU, a learner
        # group); on Ray runners (``run.runners``), each runner's copy, synchronized so.
        agent = self.learner.online.agent
        self.on_cpu = (
            isinstance(self.learner, QMIXLearner)
            and self.learner.device.type == "cpu"
            and cfg.run.runners == 0
        )
        self.runner: MultiAgentRunner | MultiAgentSampler
        if cfg.run.runners == 0:
            acting_agent = agent if self.on_cpu else uncompiled_copy(agent).requires_grad_(False)
            acting = build_acting(cfg, env, self.group, acting_agent, 0)
            seed = derive_seed(cfg.run.seed, "env", 0)
            self.runner = MultiAgentRunner(env, acting, cfg.rollout_steps, seed)
        else:  # the runners build their own envs
            env.close()
            self.runner = runners_for(functools.partial(build_runner, cfg), cfg.run)
        self.builder = EpisodeBuilder(self.runner.num_envs, self.replay, self.group)
        self._start_episodes()
        self.env_steps = 0
        self.iteration = 0

    def _start_episodes(self) -> None:
        view = self.runner.view
        self.builder.start(view.obs, view.state, view.action_mask)

    def epsilon(self) -> float:
        cfg = self.config
        progress = min(1.0, self.env_steps / cfg.exploration_steps)
        return linear(cfg.epsilon_start, cfg.epsilon_end, progress)

    def train_iteration(self) -> dict[str, float]:
        cfg = self.config
        epsilon = self.epsilon()
        self.runner.set_acting("epsilon", epsilon)
        if not self.on_cpu:
            self.runner.set_weights(self.learner.online.agent.state_dict())
        rollout = self.runner.sample()
        restarted = self.runner.restarted_envs()
        if restarted:  # a rebuilt runner's envs began new episodes: the unfinished ones go
            first = rollout.view(0)
            self.builder.restart(restarted, first.obs, first.state, first.action_mask)
        for t in range(rollout.num_steps):
            self.builder.add(rollout.actions[self.group][t], rollout.step(t))
        self.env_steps += rollout.num_steps * rollout.num_envs
        self.iteration += 1
        metrics: dict[str, float] = {"train/epsilon": epsilon}
        if len(self.replay) >= max(cfg.replay.batch_size, cfg.replay.learning_starts):
            metrics.update(self._learn())
        metrics.update(rollout.episodes.metrics([self.group]))
        return metrics

    def _learn(self) -> dict[str, float]:
        cfg = self.config
        history = []
        for _ in range(cfg.replay.gradient_steps):
            batch = to_device(self.replay.sample(cfg.replay.batch_size), self.learner.device)
            steps = batch.actions.shape[0]
            previous = torch.cat([torch.zeros_like(batch.actions[:1]), batch.actions])
            inputs = self.agent_inputs(batch.obs, previous[: steps + 1])
            stats = self.learner.update(batch, inputs)
            history.append(torch.stack(list(stats.values())))
        means = torch.stack(history).mean(0)
        metrics = dict(zip(stats, means.tolist(), strict=True))
        check_finite_metrics(metrics)  # a GPU learner's NaN check (`shoal.optim.gradients`)
        metrics["train/grad_steps"] = self.learner.grad_steps
        metrics["train/replay_episodes"] = len(self.replay)
        return metrics

    def _policy_network(self) -> RecurrentQPolicy:
        agent = uncompiled_copy(self.learner.online.agent).requires_grad_(False)
        return RecurrentQPolicy(agent, self.config.last_action, self.config.epsilon_end)

    def policy(self) -> ActorPolicy:
        return ActorPolicy(self._policy_network(), None, self.config.env.clip_obs)

    def state_dict(self) -> dict[str, Any]:
        return {
            "learner": self.learner.state_dict(),
            "replay": self.replay.state_dict() if self.config.replay.save else None,
            "policy": {"model": self._policy_network().state_dict(), "obs_stats": None},
            "runner": self.runner.get_state(),
            "builder": self.builder.state_dict(),
            "counters": {"env_steps": self.env_steps, "iteration": self.iteration},
        }

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        """Restore; returns whether the envs were restored mid-episode (a replay that was not
        saved refills: the training loop reads that from ``state``)."""
        self.learner.load_state_dict(state["learner"])
        if not self.on_cpu:
            self.runner.set_weights(self.learner.online.agent.state_dict())
        self.env_steps = int(state["counters"]["env_steps"])
        self.iteration = int(state["counters"]["iteration"])
        replay_restored = state.get("replay") is not None
        if replay_restored:
            self.replay.load_state_dict(state["replay"])
        seed = derive_seed(self.config.run.seed, "env-restart", self.iteration)
        if not self.runner.set_state(state["runner"], seed):
            self._start_episodes()
            return False
        self.builder.load_state_dict(state["builder"])
        return True

    def close(self) -> None:
        self.runner.close()
        if isinstance(self.learner, QMIXLearnerGroup):  # its Ray actors and placement group
            self.learner.close()


# Value decomposition for cooperative teams: one learner, three mixers.
SPECS = (
    AlgorithmSpec(
        "qmix",
        QMIXConfig,
        QMIX,
        build_model,
        "QMIX: recurrent agents, monotonic hypernetwork mixer on the global state",
        "Discrete (multi-agent envs)",
        runners=True,
        learner_groups=True,
    ),
    AlgorithmSpec(
        "vdn",
        QMIXConfig,
        QMIX,
        build_model,
        "VDN: recurrent agents, team Q-value as the sum of the agents' Q-values",
        "Discrete (multi-agent envs)",
        {"mixer": "vdn"},
        runners=True,
        learner_groups=True,
    ),
    AlgorithmSpec(
        "iql",
        QMIXConfig,
        QMIX,
        build_model,
        "IQL: independent recurrent Q-learners with shared weights, no mixer",
        "Discrete (multi-agent envs)",
        {"mixer": "none"},
        runners=True,
        learner_groups=True,
    ),
)
"""The names this module registers (`shoal.algos.spec`, `shoal.registry`)."""
