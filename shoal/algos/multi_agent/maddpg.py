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

Every group of the env trains at once (the paper's mixed cooperative-competitive games:
``simple_adversary``, ``simple_tag``, ...): agent ``i``'s critic sees every agent's
observation and action across groups, and its reward is its own, so opposing teams each
ascend their own critics. All ``N`` critics are one batched network; each group's actors
are one batched network (or one shared network within the group), and an update is one
backward pass and one fused Adam step (`ActorCriticCore`). Losses are logged per group as
``loss/<group>/critic`` and ``loss/<group>/actor`` when there are several.

Collection is the `shoal.collect.multi_agent.MultiAgentRunner`'s, in-process or, with
``run.runners`` N > 0, on N Ray actors (`shoal.collect.multi_agent_ray`) whose rollouts are
joined along the env axis; an iteration then takes ``N x gradient_steps`` gradient steps, so
that updates per env step stay what they are in-process. Samples are whole env steps:
every agent's observation (plus the global state when the critics use it) flattened into
one replay row per env, the joint action, and one reward per agent (`ReplayBuffer`'s
``reward_shape``); agents share their episodes (the particle worlds and PettingZoo's MPE).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from shoal.algos.cores.actor_critic_replay import (
    ActorCriticCore,
    ActorCriticLearner,
    ActorCriticReplayConfig,
)
from shoal.algos.cores.learner_group import ReplayLearnerGroup
from shoal.algos.cores.off_policy import learn_from_replay
from shoal.algos.multi_agent.joint_replay import JointLayout, make_replay
from shoal.algos.spec import AlgorithmSpec
from shoal.collect.multi_agent import JointObs, MultiAgentRollout, MultiAgentRunner
from shoal.collect.multi_agent_ray import MultiAgentSampler, runners_for
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
from shoal.config.usage import IN_STEP
from shoal.core.device import to_device
from shoal.core.errors import ConfigError
from shoal.core.seeding import derive_seed
from shoal.core.types import ReplayBatch
from shoal.envs.make import make_multi_agent_env
from shoal.envs.multi_agent import AgentGroup, MultiAgentVectorEnv
from shoal.envs.shapes import shape_of
from shoal.fast.backend import uncompiled_copy
from shoal.losses.actor_critic import deterministic_actor_loss, ensemble_td_loss
from shoal.nn.critics import CriticEnsemble, critic_inputs, replace_own_actions
from shoal.nn.multi_agent import JointActors
from shoal.nn.policy import ActorPolicy, JointPolicy


@dataclass(frozen=True)
class MADDPGConfig(ActorCriticReplayConfig):
    """MADDPG hyperparameters; defaults follow Biswas and Biswas (64-64 ReLU networks, critic lr
    1e-3, actor lr 1e-4, batch 1024). The shared replay settings are documented on
    `ActorCriticReplayConfig`."""

    UNUSED: ClassVar[dict[str, str]] = {**ActorCriticReplayConfig.UNUSED, **IN_STEP}

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
    actor_reg: float = 1e-3
    """Weight of each actor's mean squared pre-activations (the logits of discrete actions, the
    pre-``tanh`` actions of continuous ones) added to its loss, as the MADDPG authors' code
    does (1e-3). Without it a discrete policy's logits grow until its softmax saturates: the
    straight-through Gumbel-softmax gradient then vanishes, Gumbel sampling stops exploring,
    and the actor stops following its critic (on the intersection it never slowed down where
    its critic preferred to). 0 turns it off."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choices(self)
        check(self, "gumbel_temperature", self.gumbel_temperature > 0, "must be > 0")
        check(self, "actor_reg", self.actor_reg >= 0, "must be >= 0")
        check_multi_agent_learner(self, "MADDPG")
        batch = self.replay.batch_size
        split = f"must be <= replay.batch_size ({batch}): each batch is split among the learners"
        check(self.run, "learners", self.run.learners <= batch, split)


def state_dim(env: MultiAgentVectorEnv) -> int | None:
    """The size of the env's global state (None: it has none)."""
    return None if env.state_space is None else int(shape_of(env.state_space)[0])


def maddpg_groups(env: MultiAgentVectorEnv) -> list[AgentGroup]:
    """The groups MADDPG trains: every group of the env (Lowe et al.'s mixed games train
    opposing teams at once)."""
    return list(env.groups.values())


class MADDPGActing:
    """The acting side of the `MultiAgentRunner`: the decentralized actors (a CPU copy),
    exploring, on every group's observations."""

    def __init__(self, actors: JointActors):
        self.actors = actors

    @torch.inference_mode()
    def act(self, view: JointObs) -> dict[str, np.ndarray]:
        obs = {g: torch.as_tensor(o, dtype=torch.float32) for g, o in view.obs.items()}
        return {g: a.numpy() for g, a in self.actors.act_joint(obs).items()}

    def set_weights(self, weights: dict[str, torch.Tensor]) -> None:
        self.actors.load_state_dict(weights)

    def get_state(self) -> dict[str, Any]:
        return {"exploration": self.actors.exploration_state()}

    def set_state(self, state: dict[str, Any]) -> None:
        self.actors.load_exploration_state(state["exploration"])


def build_actors(config: MADDPGConfig, groups: list[AgentGroup]) -> JointActors:
    return JointActors(
        groups, config.model, config.noise, config.share_parameters, config.gumbel_temperature
    )


def build_runner(config: MADDPGConfig, index: int) -> MultiAgentRunner:
    """Runner ``index``: its own env, seeded as env ``index`` of the run, and a copy of the
    actors to act with (their weights come with every `MultiAgentRunner.set_weights`)."""
    env = make_multi_agent_env(config.env)
    actors = build_actors(config, maddpg_groups(env)).requires_grad_(False)
    seed = derive_seed(config.run.seed, "env", index)
    return MultiAgentRunner(env, MADDPGActing(actors), config.rollout_steps, seed)


def build_model(config: MADDPGConfig, obs_space: gym.Space, action_space: gym.Space):
    """The deployable actors: one group's `MultiAgentActor` on rows of agents (what
    `shoal.load` probes: ``obs_space`` and ``action_space`` are one agent's), or the
    `JointActors` of an env with several groups."""
    probe = make_multi_agent_env(dataclasses.replace(config.env, num_envs=1))
    try:
        groups = maddpg_groups(probe)
    finally:
        probe.close()
    actors = build_actors(config, groups)
    return deployable(actors, copy=False)


def deployable(actors: JointActors, copy: bool = True) -> nn.Module:
    """What a run deploys: the actors of its only group, or the joint actors of several
    (acting greedily or with exploration noise, never uniformly)."""
    model = uncompiled_copy(actors) if copy else actors
    model.requires_grad_(False)
    for actor in model.groups.values():
        actor.random_actions.fill_(False)
    model.random_actions.fill_(False)
    if len(model.groups) == 1:
        return next(iter(model.groups.values()))
    return model


def deployed_policy(actors: JointActors) -> ActorPolicy | JointPolicy:
    model = deployable(actors)
    return JointPolicy(model) if isinstance(model, JointActors) else ActorPolicy(model)


class MADDPGLearner(ActorCriticLearner[JointActors]):
    """Actors, centralized critics (one per agent of every group, batched) and targets."""

    def __init__(self, config: MADDPGConfig, groups: list[AgentGroup], state_dim: int | None):
        self.config = config
        actor = build_actors(config, groups)
        self.layout = JointLayout(actor, state_dim, config.critic_input)
        self.groups = {g.name: g.size for g in groups}
        critic_obs_dim = actor.obs_size
        if config.critic_input == "state":
            if state_dim is None:
                raise ConfigError("critic_input 'state' needs an env with a global state")
            critic_obs_dim = state_dim
        critic_space = gym.spaces.Box(-np.inf, np.inf, (critic_obs_dim,), np.float32)
        critic = CriticEnsemble(
            critic_space, actor.action_size, 1, config.model, members=actor.num_agents
        )
        self.core = ActorCriticCore(config, actor, critic, target_actor=True)

    def update(self, batch: ReplayBatch) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """One step of Lowe et al.'s Algorithm 1 on a replay batch: the batch split by agent,
        the critics' targets, the critics' TD loss, each actor's loss through its own critic
        (plus ``actor_reg`` times its mean squared pre-activations), one optimizer step, the
        target networks' update. Returns the metrics and each sample's new priority (its mean
        absolute TD error over agents)."""
        cfg, core = self.config, self.core
        actor = core.actor
        b = self.layout.split(to_device(batch, self.device), cfg.gamma)
        with torch.no_grad():
            next_actions = core.target_policy.target_actions(b.next_obs)
            next_q = core.target_critic.evaluate(critic_inputs(b.next_critic_obs, next_actions))
            target = b.returns.T + b.discounts * next_q.squeeze(-1)  # [N, M]
        q = core.critic.evaluate(critic_inputs(b.critic_obs, b.actions)).squeeze(-1)  # [N, M]
        policy_actions, preactivations = actor.actions_and_preactivations(b.obs)
        inputs = replace_own_actions(b.critic_obs, b.actions, policy_actions, actor.own_columns)
        policy_q = core.critic.evaluate(inputs, detach_weights=True).squeeze(-1)  # [N, M]
        losses, errors, metrics = group_losses(
            q, target, policy_q, b.weights, self.groups, cfg.critic_loss
        )
        if cfg.actor_reg > 0:
            losses["actor_reg"] = cfg.actor_reg * preactivations
            metrics["loss/actor_reg"] = losses["actor_reg"].detach()
        core.step(losses)
        core.update_targets()
        metrics["train/q_mean"] = q.detach().mean()
        return metrics, errors.mean(dim=0)


def group_losses(
    q: torch.Tensor,
    target: torch.Tensor,
    policy_q: torch.Tensor,
    weights: torch.Tensor,
    groups: dict[str, int],
    critic_loss: Literal["huber", "mse"],
) -> tuple[dict[str, torch.Tensor], torch.Tensor, dict[str, torch.Tensor]]:
    """The critic and actor losses of every group from ``q``, ``target`` and ``policy_q``
    ``[N, M]`` (agents in group order): each group's losses are sums over its agents of
    per-agent means, one TD regression per (agent, sample), and each actor ascends its own
    critic. Returns the two losses, the TD errors ``[N, M]`` and the metrics (per group when
    there are several)."""
    metrics: dict[str, torch.Tensor] = {}
    critic: torch.Tensor | float = 0.0
    actor: torch.Tensor | float = 0.0
    errors: list[torch.Tensor] = []
    start = 0
    for name, size in groups.items():
        rows = slice(start, start + size)
        group_critic, group_errors = ensemble_td_loss(
            q[rows].reshape(1, -1), target[rows].reshape(-1), weights.repeat(size), critic_loss
        )
        group_critic = group_critic * size
        group_actor = deterministic_actor_loss(policy_q[rows].reshape(-1)) * size
        critic, actor = critic + group_critic, actor + group_actor
        errors.append(group_errors.view(size, -1))
        if len(groups) > 1:
            metrics[f"loss/{name}/critic"] = group_critic.detach()
            metrics[f"loss/{name}/actor"] = group_actor.detach()
        start += size
    assert isinstance(critic, torch.Tensor) and isinstance(actor, torch.Tensor)  # >= 1 group
    metrics["loss/critic"], metrics["loss/actor"] = critic.detach(), actor.detach()
    return {"critic": critic, "actor": actor}, torch.cat(errors), metrics


class MADDPG:
    """One iteration: every env acts ``rollout_steps`` times with the decentralized actors
    (a `MultiAgentRunner`), the joint steps go to replay, then ``gradient_steps`` updates."""

    def __init__(self, config: MADDPGConfig):
        self.config = config
        env = make_multi_agent_env(config.env)
        groups = maddpg_groups(env)
        dim = state_dim(env)
        if config.critic_input == "state" and dim is None:
            env.close()
            raise ConfigError("critic_input is 'state' but this env provides no global state")
        self.learner: MADDPGLearner | ReplayLearnerGroup
        if config.run.learners == 1:
            self.learner = MADDPGLearner(config, groups, dim)
        else:  # each replay batch split among data-parallel copies on Ray actors
            self.learner = ReplayLearnerGroup(MADDPGLearner, config, groups, dim)
        self.joint = len(groups) > 1
        """Several groups: evaluation and deployment act on every group at once."""
        self.runner: MultiAgentRunner | MultiAgentSampler
        if config.run.runners == 0:
            # Acting runs on the CPU with a copy of the weights, whatever the learner's device.
            acting = uncompiled_copy(self._actors()).requires_grad_(False)
            seed = derive_seed(config.run.seed, "env", 0)
            self.runner = MultiAgentRunner(env, MADDPGActing(acting), config.rollout_steps, seed)
        else:  # the runners build their own envs
            env.close()
            self.runner = runners_for(functools.partial(build_runner, config), config.run)
        seed = derive_seed(config.run.seed, "replay", 0)
        self.replay = make_replay(
            config.replay, self.runner.num_envs, self._local().layout, seed, self.learner.device
        )
        self.env_steps = 0
        self.iteration = 0

    def train_iteration(self) -> dict[str, float]:
        cfg = self.config
        self.learner.set_random_actions(self.env_steps < cfg.replay.learning_starts)
        self.runner.set_weights(self.learner.get_weights())
        rollout = self._collect()
        self.iteration += 1
        metrics: dict[str, float] = {}
        if self.env_steps > cfg.replay.learning_starts and self.replay.num_sampleable() > 0:
            metrics.update(self._learn())
        metrics.update(rollout.episodes.metrics())
        return metrics

    def _local(self) -> MADDPGLearner:
        """The learner, or a group's synchronized copy of it."""
        learner = self.learner
        return learner.synchronized() if isinstance(learner, ReplayLearnerGroup) else learner

    def _actors(self) -> JointActors:
        return self._local().core.actor

    def _collect(self) -> MultiAgentRollout:
        """A rollout with the acting actors, stored in replay."""
        rollout = self.runner.sample()
        # A rebuilt runner's envs began new episodes: the steps in between were lost.
        self.replay.cut_episodes(self.runner.restarted_envs())
        self.replay.extend(*self._local().layout.steps(rollout))
        self.env_steps += rollout.num_steps * rollout.num_envs
        return rollout

    def _learn(self) -> dict[str, float]:
        rollouts = self.runner.num_runners
        return learn_from_replay(self.config, self.replay, self.learner, self.env_steps, rollouts)

    def policy(self) -> ActorPolicy | JointPolicy:
        return deployed_policy(self._actors())

    def state_dict(self) -> dict[str, Any]:
        return {
            "learner": self.learner.state_dict(),
            "runner": self.runner.get_state(),
            "replay": self.replay.state_dict() if self.config.replay.save else None,
            "policy": {
                "model": deployable(self._actors()).state_dict(),
                "obs_stats": None,
            },
            "counters": {"env_steps": self.env_steps, "iteration": self.iteration},
        }

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        """Restore; returns whether the envs were restored mid-episode (a replay that was not
        saved refills: the training loop reads that from ``state``)."""
        self.learner.load_state_dict(state["learner"])
        self.runner.set_weights(self.learner.get_weights())
        self.env_steps = state["counters"]["env_steps"]
        self.iteration = state["counters"]["iteration"]
        seed = derive_seed(self.config.run.seed, "env-restart", self.iteration)
        env_restored = self.runner.set_state(state["runner"], seed)
        replay_restored = state.get("replay") is not None
        if replay_restored:
            self.replay.load_state_dict(state["replay"])
        return env_restored

    def close(self) -> None:
        self.runner.close()
        if isinstance(self.learner, ReplayLearnerGroup):  # its Ray actors and placement group
            self.learner.close()


SPECS = (
    AlgorithmSpec(
        "maddpg",
        MADDPGConfig,
        MADDPG,
        build_model,
        "MADDPG: decentralized actors, centralized critics, Gumbel-softmax, prioritized replay",
        "Discrete, Box (multi-agent envs)",
        acts_jointly=True,
        runners=True,
        learner_groups=True,
    ),
)
"""The names this module registers (`shoal.algos.spec`, `shoal.registry`)."""
