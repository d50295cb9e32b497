"""CTEDD: Centralized Training and Exploration with Decentralized execution via policy
Distillation (Gang Chen 2019, "A New Framework for Multi-Agent Reinforcement Learning -
Centralized Training and Exploration with Decentralized Execution via Policy Distillation"),
built on MADDPG's parts.

**Stage 1 (centralized training and exploration, section 4.1).** Every agent's global policy
``pi~_i(s) = pi_{theta_i}(s) + eps * sigma_{omega_i}(s)`` reads the env's full global state
through a shared global network with one component per agent (`GlobalActor`,
`ExplorationScale`). Acting samples ``a = mu(s) + sigma(s) * eps``, clipped to ``[-1, 1]``.
Critics ``Q_i(s, a_1..a_N)`` (one per agent, batched, on the state and all actions) learn by
Eq. (2) as MADDPG's do, bootstrapping from the target deterministic actions (the paper keeps
target networks of the deterministic parts "as MADDPG"); the deterministic parts and the
shared network follow Eq. (4), MADDPG's deterministic policy gradient (critic ``i`` with agent
``i``'s action replaced). The exploration scales follow Eq. (5), the maximum-entropy policy
gradient with advantage ``Q(s, a_sampled) - Q(s, mu(s))``, on the samples collected since the
previous iteration (footnote 1: Eq. (3) holds for samples of the current policy); the entropy
factor anneals linearly from ``alpha_start`` (0.1) to ``alpha_end`` (0.001).

**Stage 2 (chronological policy distillation, section 4.2).** Every ``distill_every`` env
steps (and once more at ``run.total_steps``) the local policies (`LocalPolicies`: own
observation plus the others' messages, produced by their own part 1 within the step) regress
onto the current deterministic global actions, Eq. (6), on states from the replay only (no
new env samples). Our reading of "chronological": one pass over the replay from its oldest
valid row to its newest, in consecutive minibatches, each trained for ``distill_repeats``
steps, so the last updates fit the state distribution of the latest global policy; the local
policies are kept (warm-started) from round to round. Local messages are internal to the
local policies, sized by ``message_dim``; the env runs without its own message channel
(``env.kwargs.message_dim`` must be 0). ``extra_message_dims`` distills further local
policies (CTEDD-L-3 beside CTEDD-L-1) from the same global policy and replay.

`CTEDD.policy` deploys the ``message_dim`` local policies on rows of agents (as MADDPG's
actors); `CTEDD.evaluate_global` and `CTEDD.evaluate_local` score CTEDD-G and CTEDD-L with
the shared evaluation (`shoal.collect.evaluate.evaluate_joint`).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
import torch

from shoal.algos.cores.actor_critic_replay import (
    ActorCriticReplayConfig,
)
from shoal.algos.cores.learner_group import ReplayLearnerGroup
from shoal.algos.cores.off_policy import learn_from_replay, make_priorities
from shoal.algos.multi_agent.ctedd_acting import (
    CTEDDActing,
    Team,
    acting_weights,
    build_runner,
    team_of,
)
from shoal.algos.multi_agent.ctedd_learner import CTEDDLearner
from shoal.algos.multi_agent.distillation import Student, chronological_rows, distill_round
from shoal.algos.multi_agent.joint_replay import replay_steps
from shoal.algos.spec import AlgorithmSpec
from shoal.collect.evaluate import evaluate_joint_episodes
from shoal.collect.multi_agent import (
    FixedGroups,
    MultiAgentEpisodes,
    MultiAgentRunner,
)
from shoal.collect.multi_agent_ray import MultiAgentSampler, runners_for
from shoal.config import (
    EnvConfig,
    ModelConfig,
    OptimConfig,
    ReplayConfig,
    check,
    check_multi_agent_learner,
    check_positive,
)
from shoal.config.usage import IN_STEP
from shoal.core.errors import ConfigError
from shoal.core.seeding import derive_seed
from shoal.data.replay import ReplayBuffer
from shoal.envs.make import make_multi_agent_env
from shoal.envs.multi_agent import AgentGroup, MultiAgentVectorEnv
from shoal.envs.shapes import shape_of
from shoal.fast.backend import place, uncompiled_copy
from shoal.nn.local_policies import LocalPolicies
from shoal.nn.policy import ActorPolicy, JointPolicy


@dataclass(frozen=True)
class CTEDDConfig(ActorCriticReplayConfig):
    """CTEDD hyperparameters; defaults follow Chen's section 5.2 (lr 0.005, batch
    1024, gamma 0.95, 64-unit policy layers, 64x64 critics, alpha 0.1 -> 0.001) and MADDPG's
    defaults otherwise. The shared replay settings are documented on `ActorCriticReplayConfig`."""

    UNUSED: ClassVar[dict[str, str]] = {**ActorCriticReplayConfig.UNUSED, **IN_STEP}

    env: EnvConfig = field(
        default_factory=lambda: EnvConfig(
            id="shoal/cn-v1-v0", num_envs=8, kwargs={"continuous": True}
        )
    )
    optim: OptimConfig = field(
        default_factory=lambda: OptimConfig(lr=5e-3, eps=1e-8, max_grad_norm=0.5)
    )
    """Adam for every network (the paper's 0.005); gradient norms clipped at 0.5 (MADDPG)."""
    model: ModelConfig = field(
        default_factory=lambda: ModelConfig(hidden=(64, 64), activation="relu")
    )
    """Hidden layers of each centralized critic (the paper's 64x64)."""
    gamma: float = 0.95
    """Discount factor (MADDPG's 0.95)."""
    tau: float = 0.01
    """Target networks: target <- tau * online + (1 - tau) * target."""
    replay: ReplayConfig = field(
        default_factory=lambda: ReplayConfig(
            buffer_size=1_000_000, batch_size=1024, learning_starts=1024
        )
    )
    """Replay of joint steps; batch_size transitions per gradient step of stage 1 (the
    paper's 1024), learning_starts env steps of uniformly random actions."""
    global_hidden: tuple[int, ...] = (64,)
    """Hidden layers of the shared global network of the global policies (Figure 1)."""
    local_hidden: tuple[int, ...] = (64,)
    """Hidden layers of each agent's component of the global policies, and of part 1 and
    part 2 of the local policies (Figure 2)."""
    sigma_init: float = 0.6
    """Initial exploration scale (the middle of the fixed scales 0.4-0.8 of Figure 6)."""
    sigma_min: float = 0.01
    """Lower bound of the exploration scale."""
    sigma_max: float = 1.0
    """Upper bound of the exploration scale (actions live in [-1, 1])."""
    exploration_lr: float = 1e-3
    """Adam learning rate of the exploration scales (lower than the deterministic parts':
    Eq. (5)'s score-function gradients are noisy, and a scale pushed against its bounds by
    Adam needs as many steps to come back)."""
    normalize_advantages: bool = True
    """Divide Eq. (5)'s advantages by their standard deviation over the batch (no centering,
    so every sample's sign is kept): the entropy factor then weighs against an advantage of
    unit scale whatever the task's reward scale (ours; the paper does not say)."""
    alpha_start: float = 0.1
    """Entropy regularization factor of Eq. (5) at the start."""
    alpha_end: float = 0.001
    """Entropy factor after annealing."""
    alpha_anneal_steps: int | None = None
    """Env steps of the linear annealing (the paper: 3M; None: run.total_steps)."""
    message_dim: int = 1
    """Numbers per message of the deployed local policies (CTEDD-L-1 or CTEDD-L-3)."""
    extra_message_dims: tuple[int, ...] = ()
    """Further local policies distilled at the same rounds from the same global policy and
    replay (e.g. (3,) beside message_dim 1); evaluated and checkpointed, not deployed."""
    distill_every: int = 10_000
    """Env steps between distillation rounds (one more at run.total_steps)."""
    distill_batch_size: int = 1024
    """Replay rows per chronological minibatch."""
    distill_repeats: int = 4
    """Gradient steps on each chronological minibatch ("multiple repetitions")."""
    distill_lr: float = 1e-3
    """Adam learning rate of the local policies."""
    evaluate_rounds: bool = True
    """At each distillation round, evaluate CTEDD-G and every CTEDD-L on run.eval_episodes
    episodes (metrics eval/global_return and eval/local_return_m<M>)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive(self, "distill_every", "distill_batch_size", "distill_repeats")
        check_multi_agent_learner(self, "CTEDD", opponents=True)
        check_positive(self, "distill_lr", "exploration_lr")
        check(self, "message_dim", self.message_dim >= 0, "must be >= 0")
        check(
            self,
            "extra_message_dims",
            all(m >= 0 and m != self.message_dim for m in self.extra_message_dims)
            and len(set(self.extra_message_dims)) == len(self.extra_message_dims),
            "must be distinct sizes >= 0 other than message_dim",
        )
        check(
            self,
            "sigma_min",
            0 < self.sigma_min < self.sigma_init < self.sigma_max,
            "need 0 < sigma_min < sigma_init < sigma_max",
        )
        check(self, "alpha_end", self.alpha_end >= 0, "must be >= 0")
        check(self, "alpha_start", self.alpha_start >= 0, "must be >= 0")
        batch = self.replay.batch_size
        split = f"must be <= replay.batch_size ({batch}): each batch is split among the learners"
        check(self.run, "learners", self.run.learners <= batch, split)
        if self.alpha_anneal_steps is not None:
            check_positive(self, "alpha_anneal_steps")
        if self.env.kwargs.get("message_dim", 0):
            raise ConfigError(
                "CTEDDConfig.env.kwargs.message_dim must be 0: CTEDD's local policies exchange "
                "their own messages within the step; size them with message_dim"
            )


def build_local(config: CTEDDConfig, group: AgentGroup, message_dim: int) -> LocalPolicies:
    obs_dim, action_dim = shape_of(group.observation_space)[0], shape_of(group.action_space)[0]
    return LocalPolicies(obs_dim, action_dim, group.size, message_dim, config.local_hidden)


def build_model(config: CTEDDConfig, obs_space: gym.Space, action_space: gym.Space):
    """The deployable local policies (``message_dim``) for `shoal.load`."""
    probe = make_multi_agent_env(dataclasses.replace(config.env, num_envs=1))
    try:
        group = team_of(probe, config.env.opponents)
    finally:
        probe.close()
    return build_local(config, group, config.message_dim)


class CTEDD:
    """One iteration: act ``rollout_steps`` times with the global policies, store the joint
    steps, ``gradient_steps`` updates of stage 1 and one exploration update on the new steps,
    then a distillation round when one is due."""

    def __init__(self, config: CTEDDConfig):
        self.config = config
        self.env = make_multi_agent_env(config.env)
        self.group = team_of(self.env, config.env.opponents)
        # Each runner (on Ray) steps env.num_envs envs of its own
        num_envs = self.env.num_envs * max(1, config.run.runners)
        n = self.group.size
        self.obs_dim = shape_of(self.group.observation_space)[0]
        self.action_dim = shape_of(self.group.action_space)[0]
        if self.env.state_space is None:
            raise ConfigError(
                f"CTEDD's global policies read a global state; {config.env.id} has none"
            )
        self.state_dim = int(shape_of(self.env.state_space)[0])
        sizes = (n, self.action_dim, self.state_dim, n * self.obs_dim)
        self.learner: CTEDDLearner | ReplayLearnerGroup
        if config.run.learners == 1:
            self.learner = CTEDDLearner(config, *sizes)
        else:  # each replay batch split among data-parallel copies on Ray actors
            self.learner = ReplayLearnerGroup(CTEDDLearner, config, *sizes)
        dims = (config.message_dim, *config.extra_message_dims)
        device, compiled = self.learner.device, config.run.compile
        self.students = {
            m: Student(
                place(build_local(config, self.group, m), device, compiled), config.distill_lr
            )
            for m in dims
        }
        # A row: the joint observations (for the local policies), then the state (stage 1).
        row_dim = n * self.obs_dim + self.state_dim
        self.replay = ReplayBuffer(
            config.replay.buffer_size,
            num_envs,
            gym.spaces.Box(-np.inf, np.inf, (row_dim,), np.float32),
            gym.spaces.Box(-1.0, 1.0, (n, self.action_dim), np.float32),
            n_step=config.replay.n_step,
            priorities=make_priorities(config.replay, num_envs),
            seed=derive_seed(config.run.seed, "replay", 0),
            reward_shape=(n,),
            device=device,
        )
        self.runner: MultiAgentRunner | MultiAgentSampler
        if config.run.runners == 0:
            opponents = FixedGroups(config.env.opponents, self.env.groups, config.run.seed)
            local = self._local()
            self.acting = CTEDDActing(local.core.actor, local.scale, self.group.name, opponents)
            seed = derive_seed(config.run.seed, "env", 0)
            self.runner = MultiAgentRunner(self.env, self.acting, config.rollout_steps, seed)
        else:  # the runners build their own envs
            self.env.close()
            self.runner = runners_for(functools.partial(build_runner, config), config.run)
        self.env_steps = 0
        self.iteration = 0
        self.next_distill = config.distill_every
        self.distill_rounds = 0
        self._eval_env: MultiAgentVectorEnv | None = None

    # --- stage 1 ------------------------------------------------------------------------------

    def alpha(self) -> float:
        """The entropy factor of Eq. (5), linear from alpha_start to alpha_end."""
        cfg = self.config
        horizon = cfg.alpha_anneal_steps or cfg.run.total_steps
        share = min(1.0, self.env_steps / horizon)
        return cfg.alpha_start + (cfg.alpha_end - cfg.alpha_start) * share

    def _local(self) -> CTEDDLearner:
        """The learner, or a group's synchronized copy of it."""
        learner = self.learner
        return learner.synchronized() if isinstance(learner, ReplayLearnerGroup) else learner

    def _collect(self) -> tuple[MultiAgentEpisodes, torch.Tensor, torch.Tensor]:
        local = self._local()
        self.runner.set_weights(acting_weights(local.core.actor, local.scale))
        rollout = self.runner.sample()
        name = self.group.name
        actions = rollout.actions[name].astype(np.float32)
        # A rebuilt runner's envs began new episodes: the steps in between were lost.
        self.replay.cut_episodes(self.runner.restarted_envs())
        self.replay.extend(*replay_steps(rollout, actions, with_state=True, groups=[name]))
        self.env_steps += rollout.num_steps * rollout.num_envs
        runner = self.runner
        if isinstance(runner, MultiAgentSampler):
            assert runner.drained is not None  # CTEDDActing keeps its states and samples
            states, sampled = runner.drained
        else:
            states, sampled = self.acting.drain()
        return rollout.episodes, states, sampled

    def train_iteration(self) -> dict[str, float]:
        cfg = self.config
        learning = self.env_steps >= cfg.replay.learning_starts
        self.learner.set_random_actions(not learning)
        episodes, states, sampled = self._collect()
        self.iteration += 1
        metrics: dict[str, float] = {}
        if self.env_steps > cfg.replay.learning_starts and self.replay.num_sampleable() > 0:
            # Eq. (5) first: the samples' log-likelihoods are those of the policy that drew
            # them only while the deterministic parts have not moved yet (footnote 1).
            if learning and len(states):
                args = (states, sampled, self.alpha())
                learner = self.learner
                if isinstance(learner, ReplayLearnerGroup):  # every learner takes it whole
                    metrics.update(learner.call("exploration_update", *args))
                else:
                    metrics.update(learner.exploration_update(*args))
            metrics.update(self._learn())
        if self.env_steps >= self.next_distill or self.env_steps >= cfg.run.total_steps:
            metrics.update(self.distill())
            self.next_distill = (self.env_steps // cfg.distill_every + 1) * cfg.distill_every
        metrics.update(episodes.metrics([self.group.name]))
        return metrics

    def _learn(self) -> dict[str, float]:
        """MADDPG's replay-sampling loop (prioritized replay's beta annealing included), its
        ``gradient_steps`` per runner's rollout."""
        rollouts = self.runner.num_runners
        return learn_from_replay(self.config, self.replay, self.learner, self.env_steps, rollouts)

    # --- stage 2 ------------------------------------------------------------------------------

    def distill(self) -> dict[str, float]:
        """One chronological distillation round of every local policy (Eq. (6),
        `shoal.algos.multi_agent.distillation`), then the evaluations when asked."""
        cfg, n = self.config, self.group.size
        written = self.env_steps // self.replay.num_envs  # one replay row per vector step
        rows = torch.as_tensor(chronological_rows(self.replay, written)).to(self.learner.device)
        obs = rows[:, : n * self.obs_dim].reshape(-1, n, self.obs_dim)
        with torch.no_grad():
            teacher = self._local().core.actor(rows[:, n * self.obs_dim :])
        self.distill_rounds += 1
        metrics: dict[str, float] = {"distill/rows": float(len(rows))}
        metrics.update(
            distill_round(self.students, obs, teacher, cfg.distill_batch_size, cfg.distill_repeats)
        )
        if cfg.evaluate_rounds:
            seed = derive_seed(cfg.run.seed, "ctedd-eval", self.distill_rounds)
            metrics["eval/global_return"] = self.evaluate_global(seed=seed)
            for m in self.students:
                metrics[f"eval/local_return_m{m}"] = self.evaluate_local(m, seed=seed)
        return metrics

    # --- evaluation and deployment ------------------------------------------------------------

    def evaluate_global(self, episodes: int | None = None, seed: int = 0) -> float:
        """CTEDD-G: mean per-agent return of the deterministic global policies (on states)."""
        actor = uncompiled_copy(self._local().core.actor)
        return self.evaluate_team(lambda obs, state: actor(state), episodes, seed)

    def evaluate_local(
        self, message_dim: int | None = None, episodes: int | None = None, seed: int = 0
    ) -> float:
        """CTEDD-L-<message_dim>: mean per-agent return of the distilled local policies."""
        local = self.students[self.config.message_dim if message_dim is None else message_dim]
        policies = uncompiled_copy(local.policies)
        return self.evaluate_team(lambda obs, state: policies(obs), episodes, seed)

    def evaluate_team(self, act, episodes: int | None = None, seed: int = 0) -> float:
        """The team acting by ``act(obs [B, N, o], state [B, S]) -> [B, N, d]`` (on the
        CPU), the other groups by their ``env.opponents``: the mean per-agent return of the
        first episode of each of ``episodes`` envs (`shoal.collect.evaluate.evaluate_joint`)."""
        episodes = episodes or self.config.run.eval_episodes
        if self._eval_env is None or self._eval_env.num_envs != episodes:
            if self._eval_env is not None:
                self._eval_env.close()
            env_config = dataclasses.replace(self.config.env, num_envs=episodes)
            self._eval_env = make_multi_agent_env(env_config)
        env, name = self._eval_env, self.group.name
        policy = JointPolicy(Team(name, list(env.groups), act))
        if self.config.env.opponents:
            policy = policy.with_fixed(self.config.env.opponents, env.groups)
        return float(evaluate_joint_episodes(policy, env, seed).groups[name].mean())

    def policy(self) -> ActorPolicy:
        """The deployable CTEDD-L-<message_dim> local policies (rows of agents)."""
        return ActorPolicy(uncompiled_copy(self.students[self.config.message_dim].policies))

    # --- checkpoints --------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "learner": self.learner.state_dict(),
            "students": {str(m): s.state_dict() for m, s in self.students.items()},
            "runner": self.runner.get_state(),
            "replay": self.replay.state_dict() if self.config.replay.save else None,
            "policy": {
                "model": self.students[self.config.message_dim].policies.state_dict(),
                "obs_stats": None,
            },
            "counters": {
                "env_steps": self.env_steps,
                "iteration": self.iteration,
                "next_distill": self.next_distill,
                "distill_rounds": self.distill_rounds,
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        """Restore; returns whether the envs were restored mid-episode (a replay that was not
        saved refills: the training loop reads that from ``state``)."""
        self.learner.load_state_dict(state["learner"])
        for m, student in self.students.items():
            student.load_state_dict(state["students"][str(m)])
        counters = state["counters"]
        self.env_steps, self.iteration = counters["env_steps"], counters["iteration"]
        self.next_distill = counters["next_distill"]
        self.distill_rounds = counters["distill_rounds"]
        seed = derive_seed(self.config.run.seed, "env-restart", self.iteration)
        env_restored = self.runner.set_state(state["runner"], seed)
        if state.get("replay") is not None:
            self.replay.load_state_dict(state["replay"])
        return env_restored

    def close(self) -> None:
        self.runner.close()
        if self._eval_env is not None:
            self._eval_env.close()
        if isinstance(self.learner, ReplayLearnerGroup):  # its Ray actors and placement group
            self.learner.close()


SPECS = (
    AlgorithmSpec(
        "ctedd",
        CTEDDConfig,
        CTEDD,
        build_model,
        "CTEDD: global policies with learned exploration, distilled into message-passing "
        "local ones",
        "Box (multi-agent envs with a global state)",
        runners=True,
        learner_groups=True,
    ),
)
"""The names this module registers (`shoal.algos.spec`, `shoal.registry`)."""
