"""MAPPO and IPPO with several policies: each agent group (or each agent, or any mapping of
agents to policies, `shoal.envs.policy_map`) trains its own PPO policy in one env, as in
competitive and mixed games where opposing teams learn at once.

Every policy is a whole PPO learner (`shoal.algos.policy_gradient.ppo.PPOLearner`: its own
actor-critic, optimizer, schedules and, where ``policies`` gives them, its own settings) on the rows
of its agents only: its batch, its GAE, its minibatches. With ``env.global_state`` (MAPPO) each
policy's critic reads the env's global state, a centralized critic per policy; without it (IPPO)
each reads its agent's own observation. A policy marked ``frozen`` acts and is never updated (a
fixed opponent at its initial weights); groups named in ``env.opponents`` act by a scripted or
random policy. Collection is one `MultiAgentRunner` with
`shoal.collect.multi_policy.MultiPolicyActing`: every policy's rollout comes from the same env
steps. Losses are logged per policy, ``loss/<policy>/...``, as are the training statistics
(``train/<policy>/...``) and returns (``episode/return/<policy>``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from shoal.algos.cores.checks import check_masks
from shoal.algos.cores.rollout_batch import make_batch
from shoal.algos.policy_gradient.ppo import PPO, PPOConfig, PPOLearner, build_model
from shoal.algos.spec import NUMPY_BACKENDS, AlgorithmSpec
from shoal.collect.multi_agent import FixedGroups, MultiAgentRunner
from shoal.collect.multi_policy import MultiPolicyActing, policy_rows
from shoal.collect.self_play import SelfPlaySeats, SnapshotPool
from shoal.config import from_dict
from shoal.core.errors import ConfigError
from shoal.core.seeding import derive_seed
from shoal.envs.make import make_multi_agent_env
from shoal.envs.multi_agent import MultiAgentVectorEnv, is_multi_agent_id
from shoal.envs.opponents import make_opponents
from shoal.envs.policy_map import PolicyAgents, resolve_policies
from shoal.envs.shapes import shape_of
from shoal.fast.backend import uncompiled_copy
from shoal.losses import adaptive_kl_coeff
from shoal.nn.policy import JointPolicy
from shoal.nn.policy_set import PolicySet
from shoal.optim.schedules import scheduled


def several_policies(config: PPOConfig) -> bool:
    """Whether a MAPPO/IPPO config trains several policies (a policy map, a policy per agent,
    or several groups without fixed opponents and no ``env.group``)."""
    env = config.env
    if not is_multi_agent_id(env.id):
        if config.self_play.snapshot_every:
            raise ConfigError(
                f"self_play plays the seats of a multi-agent env against each other; "
                f"{env.id!r} is a single-agent env"
            )
        return False
    if env.policy_map or env.policy_per_agent or config.self_play.snapshot_every:
        return True
    if env.group is not None:
        return False
    probe = make_multi_agent_env(dataclasses.replace(env, num_envs=1))
    try:
        learning = [g for g in probe.groups if g not in env.opponents]
    finally:
        probe.close()
    return len(learning) > 1


def multi_agent_ppo(config: PPOConfig) -> Any:
    """PPO, MAPPO and IPPO: `MultiPolicyPPO` when the run trains several policies (or plays
    against a snapshot pool), else PPO (on the rows of the one learning group of a
    multi-agent env, `shoal.envs.agents_as_batch`)."""
    return MultiPolicyPPO(config) if several_policies(config) else PPO(config)


def policy_config(config: PPOConfig, name: str) -> tuple[PPOConfig, bool]:
    """Policy ``name``'s PPO settings (``config.policies[name]`` over the run's) and whether
    it is frozen."""
    overrides = dict(config.policies.get(name, {}))
    frozen = bool(overrides.pop("frozen", False))
    shared = sorted(set(overrides) & {"run", "env", "policies", "self_play"})
    if shared:
        raise ConfigError(
            f"policies.{name} sets {shared}: run, env and self-play settings are the run's, "
            "not a policy's"
        )
    base = dataclasses.replace(config, policies={})
    return from_dict(PPOConfig, overrides, path=f"policies.{name}", base=base), frozen


def build_policy_set(config: PPOConfig, env: MultiAgentVectorEnv) -> PolicySet:
    """The deployable policies of ``env`` for ``config`` (weights as built)."""
    policies = _policies(config, env)
    rows = policy_rows(policies, env.state_space, config.env.agent_id, config.env.global_state)
    models = {
        name: build_model(policy_config(config, name)[0], rows[name].observation_space,
                          p.action_space)
        for name, p in policies.items()
    }  # fmt: skip
    opponents = make_opponents(config.env.opponents, env.groups, None)
    state_dim = 0 if env.state_space is None else int(shape_of(env.state_space)[0])
    return PolicySet(env.groups, policies, rows, models, opponents, state_dim)


def build_multi_agent_model(config: PPOConfig, obs_space: Any, action_space: Any) -> Any:
    """`shoal.load`'s builder for MAPPO / IPPO: the `PolicySet` of the run's env when it
    trains several policies, else PPO's network for rows of agents."""
    if not several_policies(config):
        return build_model(config, obs_space, action_space)
    probe = make_multi_agent_env(dataclasses.replace(config.env, num_envs=1))
    try:
        return build_policy_set(config, probe)
    finally:
        probe.close()


def _policies(config: PPOConfig, env: MultiAgentVectorEnv) -> dict[str, PolicyAgents]:
    cfg = config.env
    policies = resolve_policies(env.groups, cfg.policy_map, cfg.policy_per_agent, cfg.opponents)
    unknown = [name for name in config.policies if name not in policies]
    if unknown:
        raise ConfigError(
            f"policies names {unknown}, which this run does not have: {list(policies)}"
        )
    return policies


class MultiPolicyPPO:
    """One iteration: a rollout of every policy's agents from the same env steps, one PPO
    update per learning policy, the new weights to the acting copies."""

    joint = True
    """Evaluation and deployment act with every policy at once (`shoal.nn.policy.JointPolicy`)."""

    def __init__(self, config: PPOConfig):
        self.config = config
        cfg = config.env
        for name, ok in (("normalize_obs", not cfg.normalize_obs),
                         ("normalize_reward", not cfg.normalize_reward)):  # fmt: skip
            if not ok:
                raise ConfigError(
                    f"env.{name} is not supported with several policies yet; each policy "
                    "would need statistics of its own"
                )
        if config.run.runners:
            raise ConfigError("several policies sample in-process for now: set run.runners to 0")
        if config.run.learners > 1:
            raise ConfigError(
                "run.learners > 1: several policies train in the run's process for now (each "
                "learner group holds one policy); set run.learners to 1"
            )
        if config.model.lstm_hidden is not None:
            raise ConfigError(
                "several policies take feed-forward networks: unset model.lstm_hidden"
            )
        env = make_multi_agent_env(cfg)
        try:
            self._build(env)
        except BaseException:  # a run that fails to start leaves no env process behind
            env.close()
            raise

    def _build(self, env: MultiAgentVectorEnv) -> None:
        config, cfg = self.config, self.config.env
        policy_set = build_policy_set(config, env)
        self.policies = policy_set.policies
        self.masked = getattr(env, "action_mask", None) is not None
        self.settings: dict[str, PPOConfig] = {}
        self.frozen: set[str] = set()
        self.learners: dict[str, PPOLearner] = {}
        for name in self.policies:
            settings, frozen = policy_config(config, name)
            if self.masked:
                check_masks(settings, "PPO")
            self.settings[name] = settings
            if frozen:
                self.frozen.add(name)
            rows = policy_set.rows[name]
            self.learners[name] = PPOLearner(
                settings, rows.observation_space, self.policies[name].action_space
            )
        # The acting side's fixed opponents are its own (the deployable policy set has
        # others): evaluation never draws from the generators that training draws from.
        opponents = FixedGroups(cfg.opponents, env.groups, config.run.seed)
        models = {}
        for name, learner in self.learners.items():
            models[name] = uncompiled_copy(learner.model).requires_grad_(False)
        self.seats = self._self_play(policy_set) if config.self_play.snapshot_every else None
        acting = MultiPolicyActing(
            env.groups,
            self.policies,
            policy_set.rows,
            models,
            opponents,
            config.num_steps,
            cfg.num_envs,
            self.masked,
            config.model.backend,
            None if self.seats is None else (next(iter(self.policies)), self.seats),
        )
        self.acting = acting
        self.policy_set = policy_set
        self.runner = MultiAgentRunner(
            env, acting, config.num_steps, derive_seed(config.run.seed, "env", 0)
        )
        self.kl_coeff = {name: s.kl_coeff for name, s in self.settings.items()}
        self.env_steps = 0
        self.iteration = 0
        self._broadcast()

    def _self_play(self, policy_set: PolicySet) -> SelfPlaySeats:
        """The pool and seats of self-play: one learning policy playing every seat."""
        cfg = self.config
        seated = [p for p in self.policies.values() if p.size >= 2]
        if len(self.policies) != 1 or not seated or cfg.env.opponents:
            raise ConfigError(
                "self_play trains one policy that plays every seat of a game (e.g. both "
                f"players of a board game); this run has policies {list(self.policies)} "
                f"with agents {[p.agents for p in self.policies.values()]}"
                + (" and fixed opponents" if cfg.env.opponents else "")
            )
        name, policy = next(iter(self.policies.items()))
        settings, rows = self.settings[name], policy_set.rows[name]
        pool = SnapshotPool(cfg.self_play, derive_seed(cfg.run.seed, "self-play", 0))
        pool.add(self.learners[name].get_weights())  # the initial policy

        def make_model() -> Any:
            return build_model(settings, rows.observation_space, policy.action_space)

        seats = SelfPlaySeats(pool, cfg.env.num_envs, policy.size, make_model)
        seats.sync()
        seats.start(np.arange(cfg.env.num_envs))
        return seats

    def _self_play_metrics(self) -> dict[str, float]:
        seats = self.seats
        assert seats is not None  # called for self-play runs only
        if self.iteration % self.config.self_play.snapshot_every == 0:
            name = next(iter(self.learners))
            seats.pool.add(self.learners[name].get_weights())
            seats.sync()
        results = seats.drain()
        pool = seats.pool
        metrics = {
            "selfplay/elo": pool.learner_elo,
            "selfplay/pool_size": len(pool),
            "selfplay/pool_elo": float(np.mean(list(pool.elo.values()))),
            "selfplay/games": len(results),
        }
        if results:
            metrics["selfplay/win_rate"] = float(np.mean(results))
        return metrics

    def _broadcast(self) -> None:
        self.runner.set_weights({n: learner.get_weights() for n, learner in self.learners.items()})

    def train_iteration(self) -> dict[str, float]:
        rollout = self.runner.sample()
        rollouts = self.acting.rollouts(self.runner.view)
        self.env_steps += rollout.num_steps * rollout.num_envs
        self.iteration += 1
        metrics: dict[str, float] = {}
        for name, learner in self.learners.items():
            if name in self.frozen:
                continue
            cfg = self.settings[name]
            progress = self.env_steps / (cfg.optim.anneal_steps or cfg.run.total_steps)
            lr = scheduled(cfg.optim.lr_schedule, cfg.optim.lr, progress)
            clip_eps = scheduled(cfg.clip_schedule, cfg.clip_eps, progress)
            batch = make_batch(rollouts[name], cfg.gamma, cfg.gae_lambda)
            if batch.obs.shape[0] < 2:
                continue  # no real step of this policy's agents in the rollout
            stats = learner.update(batch, lr, clip_eps, self.kl_coeff[name])
            if cfg.kl_coeff > 0:
                self.kl_coeff[name] = adaptive_kl_coeff(
                    self.kl_coeff[name], stats["train/approx_kl"], cfg.kl_target
                )
                stats["train/kl_coeff"] = self.kl_coeff[name]
            for key, value in stats.items():
                kind, _, rest = key.partition("/")
                metrics[f"{kind}/{name}/{rest}"] = value
        self._broadcast()
        if self.seats is not None:
            metrics.update(self._self_play_metrics())
        episodes = rollout.episodes
        learning = [g for g in episodes.groups if g not in self.config.env.opponents]
        metrics.update(episodes.metrics(learning))
        if episodes.count:
            for name, policy in self.policies.items():
                returns = np.concatenate([episodes.returns[agent] for agent in policy.agents])
                metrics[f"episode/return/{name}"] = float(returns.mean())
        return metrics

    def policy(self) -> JointPolicy:
        for name, learner in self.learners.items():
            self.policy_set.models[name].load_state_dict(learner.get_weights())
        return JointPolicy(self.policy_set, self.config)

    def state_dict(self) -> dict[str, Any]:
        return {
            "learners": {n: learner.state_dict() for n, learner in self.learners.items()},
            "runner": self.runner.get_state(),
            "kl_coeff": dict(self.kl_coeff),
            "policy": {
                "model": {
                    f"models.{n}.{k}": v
                    for n, learner in self.learners.items()
                    for k, v in learner.model.state_dict().items()
                },
                "obs_stats": None,
            },
            "counters": {"env_steps": self.env_steps, "iteration": self.iteration},
        }

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        """Restore; returns False when the env's episodes restarted."""
        for name, learner in self.learners.items():
            learner.load_state_dict(state["learners"][name])
        self.kl_coeff = dict(state["kl_coeff"])
        self.env_steps = int(state["counters"]["env_steps"])
        self.iteration = int(state["counters"]["iteration"])
        self._broadcast()
        seed = derive_seed(self.config.run.seed, "env-restart", self.iteration)
        return self.runner.set_state(state["runner"], seed)

    def close(self) -> None:
        self.runner.close()


SPECS = (
    # PPO, or several policies on a multi-agent env.
    AlgorithmSpec(
        "ppo",
        PPOConfig,
        multi_agent_ppo,
        build_multi_agent_model,
        "Proximal Policy Optimization (clipped surrogate, GAE, adaptive KL)",
        "Discrete, Box, MultiDiscrete, MultiBinary, Tuple, Dict",
        backends=NUMPY_BACKENDS,
        runners=True,
        learner_groups=True,
        acts_jointly=True,
    ),
    # Multi-agent PPO: shared weights over an agent group (each agent is a row of the batch,
    # see `shoal.envs.agents_as_batch`), with a centralized (MAPPO) or an own-observation
    # (IPPO) critic.
    AlgorithmSpec(
        "mappo",
        PPOConfig,
        multi_agent_ppo,
        build_multi_agent_model,
        "Multi-agent PPO, shared weights, centralized value function on the global state",
        "Discrete, Box (multi-agent envs)",
        {"env.global_state": True, "env.agent_id": True},
        NUMPY_BACKENDS,
        runners=True,
        learner_groups=True,
        acts_jointly=True,
    ),
    AlgorithmSpec(
        "ippo",
        PPOConfig,
        multi_agent_ppo,
        build_multi_agent_model,
        "Independent PPO, shared weights, each agent's critic on its own observation",
        "Discrete, Box (multi-agent envs)",
        {"env.global_state": False, "env.agent_id": True},
        NUMPY_BACKENDS,
        runners=True,
        learner_groups=True,
        acts_jointly=True,
    ),
)
"""The names this module registers (`shoal.algos.spec`, `shoal.registry`)."""
