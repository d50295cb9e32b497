"""Multi-Agent DDPG (Lowe et al. 2017, "Multi-Agent Actor-Critic for Mixed Cooperative-Competitive
Environments", arXiv:1706.02275), with prioritized experience replay: Algorithm 1 of Biswas and
Biswas, "Autonomous driving using Multi-Agent RL" (UC San Diego, undated), and the baseline of
Chen 2019 ("A New Framework for Multi-Agent Reinforcement Learning").

Each agent has a decentralized deterministic actor on its own observation and a centralized
critic ``Q_i(x, a_1, ..., a_N)`` on ``x`` (all agents' observations, or the env's global
state) and every agent's action. Critic ``i`` regresses toward
``r_i + gamma^K Q'_i(x', a'_1, ..., a'_N)`` with the target actors' next actions; actor ``i``
follows the gradient of ``Q_i`` with its own action replaced by its policy's (the others'
actions come from replay). Discrete actions go through the Gumbel-softmax. Replay is uniform
or prioritized (rank-based or proportional, with importance weights), which Biswas and Biswas
found to stabilise MADDPG; a transition's priority is its mean absolute TD error over agents.

All ``N`` critics are one batched network and all actors one batched network (or one shared
network), and an update is one backward pass and one fused Adam step (`ActorCriticCore`).

Samples are whole env steps: the joint observations ``[N, obs_dim]`` (plus the global state
when the critics use it) flattened into one replay row per env, the joint actions, and one
reward per agent (`ReplayBuffer`'s ``reward_shape``). MADDPG trains one agent group whose
agents share their episodes (the particle worlds and PettingZoo's MPE).
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

import gymnasium as gym
import numpy as np
import torch

from shoal.algos.actor_critic_replay import (
    ActorCriticCore,
    ActorCriticLearner,
    ActorCriticReplayConfig,
)
from shoal.algos.off_policy import learn_from_replay, make_priorities
from shoal.backend import uncompiled_copy
from shoal.config import (
    EnvConfig,
    ModelConfig,
    NoiseConfig,
    OptimConfig,
    ReplayConfig,
    check,
    check_choices,
    check_multi_agent_learner,
)
from shoal.data.replay import ReplayBuffer
from shoal.envs.multi_agent import (
    AgentGroup,
    GroupEpisodes,
    MultiAgentVectorEnv,
    make_multi_agent_env,
)
from shoal.envs.snapshot import EnvStateUnsupported
from shoal.errors import ConfigError
from shoal.losses.actor_critic import deterministic_actor_loss, ensemble_td_loss
from shoal.nn.critics import CriticEnsemble
from shoal.nn.multi_agent import MultiAgentActor
from shoal.policy import ActorPolicy
from shoal.seeding import derive_seed
from shoal.types import EpisodeStats, ReplayBatch


@dataclass(frozen=True)
class MADDPGConfig(ActorCriticReplayConfig):
    """MADDPG hyperparameters; defaults follow Biswas and Biswas (64-64 ReLU networks, critic lr
    1e-3, actor lr 1e-4, batch 1024). The shared replay settings are documented on
    `ActorCriticReplayConfig`."""

    env: EnvConfig = field(default_factory=lambda: EnvConfig(id="shoal/spread-v0", num_envs=8))
    optim: OptimConfig = field(
        default_factory=lambda: OptimConfig(lr=1e-3, eps=1e-8, max_grad_norm=0.5)
    )
    """Adam; lr is the critics' (Biswas and Biswas: 1e-3); gradient norms clipped at 0.5 as the
    MADDPG authors' code does."""
    model: ModelConfig = field(
        default_factory=lambda: ModelConfig(hidden=(64, 64), activation="relu")
    )
    actor_lr: float | None = 1e-4
    """Actor learning rate (Biswas and Biswas: 1e-4)."""
    gamma: float = 0.95
    """Discount factor (the MADDPG paper's 0.95)."""
    tau: float = 0.01
    """Target networks: target <- tau * online + (1 - tau) * target (the paper's 0.01)."""
    replay: ReplayConfig = field(
        default_factory=lambda: ReplayConfig(
            buffer_size=1_000_000, batch_size=1024, learning_starts=1024
        )
    )
    """Replay of joint steps; batch_size in env steps (Biswas and Biswas: 1024),
    learning_starts env steps of uniformly random actions."""
    noise: NoiseConfig = field(default_factory=lambda: NoiseConfig(kind="gaussian", scale=0.1))
    """Exploration noise of continuous actions (discrete ones explore by Gumbel sampling)."""
    critic_input: Literal["observations", "state"] = "observations"
    """What the centralized critics see besides all actions: every agent's observation, or the
    env's global state."""
    share_parameters: bool = False
    """One actor network for all agents of the group (it gets the agent one-hot) instead of
    one per agent; the critics stay one per agent (their rewards may differ)."""
    gumbel_temperature: float = 1.0
    """Temperature of the Gumbel-softmax of discrete actions."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choices(self)
        check(self, "gumbel_temperature", self.gumbel_temperature > 0, "must be > 0")
        check_multi_agent_learner(self, "MADDPG")


def single_group(env: MultiAgentVectorEnv) -> AgentGroup:
    """The env's one agent group (MADDPG trains one); a clear error for more."""
    if len(env.groups) != 1:
        raise ConfigError(f"MADDPG trains one agent group; this env has {list(env.groups)}")
    return next(iter(env.groups.values()))


def replay_row(
    config: MADDPGConfig, group: AgentGroup, obs: dict[str, np.ndarray], state: np.ndarray | None
) -> np.ndarray:
    """``[num_envs, ...]`` what the centralized critics see: the joint observation, plus the
    global state when ``critic_input`` is "state"."""
    joint = obs[group.name].reshape(obs[group.name].shape[0], -1).astype(np.float32)
    if config.critic_input == "state":
        return np.concatenate([joint, state.astype(np.float32)], axis=1)
    return joint


@torch.inference_mode()
def collect_steps(
    config: MADDPGConfig,
    env: MultiAgentVectorEnv,
    group: AgentGroup,
    acting: MultiAgentActor,
    obs: dict[str, np.ndarray],
    state: np.ndarray | None,
    sink: Any,
) -> tuple[dict[str, np.ndarray], np.ndarray | None, EpisodeStats]:
    """MADDPG's collection step: ``rollout_steps`` vector steps with ``acting`` (exploring),
    each added to ``sink`` (a replay, or anything with its ``add``) as the critic row, joint
    actions, per-agent rewards, terminated, truncated and valid. Returns the observation and
    state to go on from and the finished episodes. Shared by MADDPG and distributed MADDPG's
    collectors."""
    episodes = GroupEpisodes(group)
    name = group.name
    for _ in range(config.rollout_steps):
        actions = acting.act_joint(torch.as_tensor(obs[name], dtype=torch.float32)).numpy()
        row = replay_row(config, group, obs, state)
        step = env.step({name: actions})
        sink.add(
            row,
            actions,
            step.rewards[name],
            step.terminated[name].all(axis=1),
            step.truncated[name].any(axis=1),
            ~step.autoreset,
        )
        obs, state = step.obs, step.state
        episodes.add(step)
    return obs, state, episodes.stats()


def critic_inputs(critic_obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """``[M, C + N * action_dim]``: what every centralized critic sees, the observations (or
    state) ``[M, C]`` and all agents' actions ``[M, N, action_dim]``."""
    return torch.cat([critic_obs, actions.flatten(1)], dim=-1)


def own_action_inputs(
    critic_obs: torch.Tensor, replayed: torch.Tensor, policy: torch.Tensor
) -> torch.Tensor:
    """``[N, M, C + N * action_dim]``: critic ``i``'s input with agent ``i``'s replayed action
    replaced by its policy's action (Lowe et al. 2017, Algorithm 1, actor update);
    ``replayed`` and ``policy`` are ``[M, N, action_dim]``."""
    n = replayed.shape[1]
    mask = torch.eye(n, dtype=torch.bool, device=replayed.device).view(n, 1, n, 1)
    actions = torch.where(mask, policy.unsqueeze(0), replayed.unsqueeze(0))
    obs = critic_obs.unsqueeze(0).expand(n, -1, -1)
    return torch.cat([obs, actions.flatten(2)], dim=-1)


def build_actor(config: MADDPGConfig, group: AgentGroup) -> MultiAgentActor:
    return MultiAgentActor(
        group.observation_space,
        group.action_space,
        group.size,
        config.model,
        config.noise,
        config.share_parameters,
        config.gumbel_temperature,
    )


def build_model(config: MADDPGConfig, obs_space: gym.Space, action_space: gym.Space):
    """The deployable actors, from the spaces of the env seen as rows of agents (what
    `shoal.load` probes): ``obs_space`` and ``action_space`` are one agent's."""
    probe = make_multi_agent_env(dataclasses.replace(config.env, num_envs=1))
    try:
        group = single_group(probe)
    finally:
        probe.close()
    return build_actor(config, group)


class MADDPGLearner(ActorCriticLearner):
    """Actors, centralized critics (one per agent, batched) and their targets."""

    def __init__(self, config: MADDPGConfig, group: AgentGroup, state_dim: int | None):
        self.config = config
        actor = build_actor(config, group)
        n, obs_dim, action_dim = group.size, actor.obs_dim, actor.action_dim
        self.num_agents, self.obs_dim, self.action_dim = n, obs_dim, action_dim
        critic_obs_dim = state_dim if config.critic_input == "state" else n * obs_dim
        critic_space = gym.spaces.Box(-np.inf, np.inf, (critic_obs_dim,), np.float32)
        critic = CriticEnsemble(critic_space, n * action_dim, 1, config.model, members=n)
        self.core = ActorCriticCore(config, actor, critic, target_actor=True)

    def split(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Replay rows -> (joint observations ``[M, N, obs_dim]``, critic inputs ``[M, C]``)."""
        joint = rows[:, : self.num_agents * self.obs_dim]
        critic = joint if self.config.critic_input == "observations" else rows[:, joint.shape[1] :]
        return joint.reshape(-1, self.num_agents, self.obs_dim), critic

    def update(self, batch: ReplayBatch) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        cfg, core = self.config, self.core
        actor: MultiAgentActor = core.actor
        batch = core.batch(batch)
        returns, discounts = core.bootstrap(batch)  # [M, N], [M]
        obs, critic_obs = self.split(batch.obs)
        next_obs, next_critic_obs = self.split(batch.next_obs)
        replayed = actor.one_hot(batch.actions)
        with torch.no_grad():
            next_actions = core.target_actor.target_actions(next_obs)
            next_inputs = critic_inputs(next_critic_obs, next_actions)
            next_q = core.target_critic.evaluate(next_inputs).squeeze(-1)  # [N, M]
            target = returns.T + discounts * next_q  # [N, M]
        q = core.critic.evaluate(critic_inputs(critic_obs, replayed)).squeeze(-1)
        # One TD regression per (agent, sample): the ensemble loss over flattened agents.
        critic_loss, errors = ensemble_td_loss(
            q.reshape(1, -1),
            target.reshape(-1),
            batch.weights.repeat(self.num_agents),
            cfg.critic_loss,
        )
        critic_loss = critic_loss * self.num_agents  # a sum over agents of per-agent means
        priorities = errors.view(self.num_agents, -1).mean(dim=0)
        inputs = own_action_inputs(critic_obs, replayed, actor(obs))
        policy_q = core.critic.evaluate(inputs, detach_weights=True).squeeze(-1)  # [N, M]
        actor_loss = deterministic_actor_loss(policy_q.reshape(-1)) * self.num_agents
        core.step({"critic": critic_loss, "actor": actor_loss})
        core.update_targets()
        metrics = {
            "loss/critic": critic_loss.detach(),
            "loss/actor": actor_loss.detach(),
            "train/q_mean": q.detach().mean(),
        }
        return metrics, priorities


class MADDPG:
    """One iteration: every env acts ``rollout_steps`` times with the decentralized actors,
    the joint steps go to replay, then ``gradient_steps`` updates."""

    def __init__(self, config: MADDPGConfig):
        self.config = config
        self.env = make_multi_agent_env(config.env)
        self.group = single_group(self.env)
        state_dim = None if self.env.state_space is None else int(self.env.state_space.shape[0])
        if config.critic_input == "state" and state_dim is None:
            raise ConfigError("critic_input is 'state' but this env provides no global state")
        self.learner = MADDPGLearner(config, self.group, state_dim)
        # Acting runs on the CPU with a copy of the weights, whatever the learner's device.
        self.acting = uncompiled_copy(self.learner.core.actor).requires_grad_(False)
        n = self.group.size
        obs_dim, action_dim = self.learner.obs_dim, self.learner.action_dim
        row_dim = n * obs_dim + (state_dim if config.critic_input == "state" else 0)
        self.replay = ReplayBuffer(
            config.replay.buffer_size,
            self.env.num_envs,
            gym.spaces.Box(-np.inf, np.inf, (row_dim,), np.float32),
            gym.spaces.Box(-np.inf, np.inf, (n,) if self.acting.discrete else (n, action_dim)),
            n_step=config.replay.n_step,
            priorities=make_priorities(config.replay, self.env.num_envs),
            seed=derive_seed(config.run.seed, "replay", 0),
            reward_shape=(n,),
        )
        self.obs, self.state = self.env.reset(seed=derive_seed(config.run.seed, "env", 0))
        self.env_steps = 0
        self.iteration = 0

    def _collect(self) -> EpisodeStats:
        self.obs, self.state, episodes = collect_steps(
            self.config, self.env, self.group, self.acting, self.obs, self.state, self.replay
        )
        self.env_steps += self.config.rollout_steps * self.env.num_envs
        return episodes

    def train_iteration(self) -> dict[str, float]:
        cfg = self.config
        self.learner.set_random_actions(self.env_steps < cfg.replay.learning_starts)
        self.acting.load_state_dict(self.learner.get_weights())
        episodes = self._collect()
        self.iteration += 1
        metrics: dict[str, float] = {}
        if self.env_steps > cfg.replay.learning_starts and self.replay.num_sampleable() > 0:
            metrics.update(self._learn())
        metrics.update(episodes.metrics())
        return metrics

    def _learn(self) -> dict[str, float]:
        return learn_from_replay(self.config, self.replay, self.learner, self.env_steps)

    def policy(self) -> ActorPolicy:
        return ActorPolicy(uncompiled_copy(self.learner.core.actor))

    def state_dict(self) -> dict[str, Any]:
        return {
            "learner": self.learner.state_dict(),
            "env": self._env_state(),
            "obs": copy.deepcopy(self.obs),
            "state": None if self.state is None else self.state.copy(),
            "exploration": self.acting.exploration_state(),
            "replay": self.replay.state_dict() if self.config.replay.save else None,
            "policy": {"model": self.learner.core.actor.state_dict(), "obs_stats": None},
            "counters": {"env_steps": self.env_steps, "iteration": self.iteration},
        }

    def _env_state(self) -> dict[str, Any] | None:
        try:
            return self.env.get_state()
        except EnvStateUnsupported:  # e.g. PettingZoo envs: episodes restart on resume
            return None

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        """Restore; returns False when the envs restarted or the replay was not saved."""
        self.learner.load_state_dict(state["learner"])
        self.acting.load_state_dict(self.learner.get_weights())
        self.acting.load_exploration_state(state["exploration"])
        self.env_steps = state["counters"]["env_steps"]
        self.iteration = state["counters"]["iteration"]
        env_restored = state["env"] is not None
        if env_restored:
            self.env.set_state(state["env"])
            self.obs = copy.deepcopy(state["obs"])
            self.state = None if state["state"] is None else state["state"].copy()
        else:
            seed = derive_seed(self.config.run.seed, "env-restart", self.iteration)
            self.obs, self.state = self.env.reset(seed=seed)
        replay_restored = state.get("replay") is not None
        if replay_restored:
            self.replay.load_state_dict(state["replay"])
        return env_restored and replay_restored

    def close(self) -> None:
        self.env.close()
