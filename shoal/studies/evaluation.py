"""Evaluating a trained run as ``shoal eval`` does, from Python too (``shoal.evaluate``).

A run is evaluated on fresh envs built from its config with raw observations (the policy
applies its frozen statistics) and whole Atari games with true rewards, one episode per env.
Multi-agent envs are played on the env's own groups: a policy trained on rows of agents acts
through `GroupPolicy`, so that samples are episodes, every group and seat is reported, and
fixed players (``random`` or ``module:Class``) can take a group's or a seat's place.
Opposing groups, or a game's seats, are never averaged into one return."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from shoal.collect.evaluate import evaluate_episodes, evaluate_joint_episodes
from shoal.config import replace
from shoal.core.errors import ShoalError
from shoal.core.stats import rate, summary
from shoal.envs import make_env
from shoal.envs.make import make_multi_agent_env
from shoal.envs.multi_agent import is_multi_agent_id
from shoal.nn.policy import GroupPolicy, JointPolicy

OUTCOMES = (("win", 1), ("draw", 0), ("loss", -1))


class RunPlayer:
    """A trained run (or one checkpoint of it, ``RUN/checkpoints/step_N``) as a fixed player
    of ``key``'s group or seat: another run, or an earlier checkpoint of the same self-play
    run, set against the one evaluated. Its ``act(obs, action_mask)`` takes the group's
    observations ``[B, N, ...]``, as fixed players do."""

    def __init__(self, policy: Any, path: str, key: str, env: Any):
        agents = {a: g.name for g in env.groups.values() for a in g.agents}
        self.group = agents.get(key, key)
        if isinstance(policy, JointPolicy):
            if self.group not in policy.groups:
                raise ShoalError(f"run {path} has no policy for group {self.group!r}")
        else:
            policy = GroupPolicy(policy, {self.group: env.groups[self.group]}, None)
            if policy.layout.global_state:
                raise ShoalError(f"run {path} reads the global state: it cannot play one group")
        self.policy = policy

    def act(self, obs: np.ndarray, action_mask: np.ndarray | None = None) -> np.ndarray:
        masks = None if action_mask is None else {self.group: action_mask}
        return self.policy.act({self.group: obs}, action_mask=masks)[self.group]


class Evaluation:
    """A run's policy and the env config it is evaluated on.

    Args:
        policy: the run's policy (`shoal.load`), with the run's config.
        fixed: ``{group or agent: "random" | "module:Class" | "run:PATH" | "pool:ID"}``
            players in place of trained ones (multi-agent envs only); ``run:PATH`` is another
            run or checkpoint, ``pool:ID`` a snapshot of the run's self-play pool.
        env_kwargs: env options over the run's own (``{"backend": "sumo"}``).
    """

    def __init__(
        self,
        policy: Any,
        fixed: dict[str, str] | None = None,
        env_kwargs: dict[str, Any] | None = None,
        loader: Any = None,
        checkpoint: Any = None,
    ):
        self.policy = policy
        self.loader = loader
        """``shoal.load``, for ``run:PATH`` players."""
        self.checkpoint = checkpoint
        """The run's checkpoint (`shoal.train.checkpoint.load_checkpoint`), for ``pool:ID``
        players: the snapshots of its self-play pool."""
        trained = self.policy.config.env
        self.env_config = replace(
            trained, normalize_obs=False, normalize_reward=False, atari_training=False,
            kwargs={**trained.kwargs, **(env_kwargs or {})},
        )  # fmt: skip
        self.joint = isinstance(self.policy, JointPolicy) or is_multi_agent_id(self.env_config.id)
        self.fixed = dict(fixed or {})
        if self.fixed and not self.joint:
            raise ShoalError(
                "fixed players apply to runs on multi-agent envs (they name a group or agent)"
            )

    def make_env(self, num_envs: int, render_mode: str | None = None) -> Any:
        """``num_envs`` evaluation envs (a multi-agent vector env for multi-agent runs)."""
        if render_mode is not None:
            config = replace(self.env_config, num_envs=num_envs, vectorization="sync")
        else:
            config = replace(self.env_config, num_envs=num_envs)
        build = make_multi_agent_env if self.joint else make_env
        return build(config, render_mode=render_mode) if render_mode else build(config)

    def playing(self, env: Any) -> Any:
        """The policy that plays ``env``: the run's, on the env's groups, with the fixed
        players in place (``run:PATH``: the policy of another run or checkpoint)."""
        policy = self.policy
        if self.joint and not isinstance(policy, JointPolicy):
            policy = GroupPolicy(policy, env.groups, env.state_space)
        if not self.fixed:
            return policy
        players: dict[str, Any] = {}
        for key, spec in self.fixed.items():
            if spec.startswith("pool:"):
                players[key] = RunPlayer(self.snapshot(spec.removeprefix("pool:")), spec, key, env)
            elif not spec.startswith("run:"):
                players[key] = spec
            elif self.loader is None:
                raise ShoalError(
                    "run:PATH players need a loader (shoal.evaluate passes shoal.load)"
                )
            else:
                path = spec.removeprefix("run:")
                players[key] = RunPlayer(self.loader(path), path, key, env)
        return policy.with_fixed(players, env.groups)

    def snapshot(self, which: str) -> JointPolicy:
        """The run's policy with the weights of snapshot ``which`` (an id) of its self-play
        pool, as the checkpoint holds it."""
        pool = self.checkpoint.self_play_pool if self.checkpoint else None
        if pool is None or not isinstance(self.policy, JointPolicy):
            raise ShoalError("pool:ID players need a self-play run (self_play.snapshot_every)")
        weights = {str(k): v for k, v in pool["weights"].items()}
        if which not in weights:
            raise ShoalError(f"the run's self-play pool holds snapshots {sorted(weights, key=int)}"
                             f", not {which!r}")  # fmt: skip
        group = self.policy.groups[0]
        model = copy.deepcopy(self.policy.model)
        models = model.models  # each policy's network (`shoal.nn.policy_set.PolicySet`)
        assert isinstance(models, torch.nn.ModuleDict), type(models)
        models[group].load_state_dict(weights[which])
        return JointPolicy(model, self.policy.config)

    def players(self, groups: dict[str, Any]) -> dict[str, str]:
        """Who plays each group (or seat, where one is fixed): ``trained``, the run's
        ``env.opponents`` or a fixed player."""
        if not groups:
            return {}
        return {**dict.fromkeys(groups, "trained"), **self.env_config.opponents, **self.fixed}

    def statistics(
        self,
        episodes: int,
        seed: int = 12345,
        deterministic: bool | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> dict:
        """The first episode of ``episodes`` envs, acting as ``deterministic`` says (None: as
        the run's ``run.eval_actions`` names, which its training evaluations used): the
        return's statistics over episodes
        (`shoal.core.stats.summary`: mean, std, median, min, max, IQM, 95% bootstrap interval),
        each group's and agent's, a game's win / draw / loss rates (95% Wilson intervals),
        the episode length and the env's own statistics. ``return`` is absent where groups
        oppose each other or a group's seats play each other. ``progress`` is told the count
        of finished episodes after each step (`shoal.train.progress.Countdown`)."""
        if deterministic is None:
            deterministic = self.policy.config.run.eval_actions == "deterministic"
        env = self.make_env(episodes)
        try:
            policy = self.playing(env)
            players = self.players(env.groups if self.joint else {})
            run_eval = evaluate_joint_episodes if self.joint else evaluate_episodes
            result = run_eval(policy, env, seed, deterministic, progress)
        finally:
            env.close()
        one_return = len(result.groups) <= 1 and not result.outcomes
        game = len(result.groups) == 1 and bool(result.outcomes)  # one group's seats compete
        return {
            "env": self.env_config.id,
            "episodes": episodes,
            "deterministic": deterministic,
            "players": players,
            **({"return": summary(result.returns)} if one_return else {}),
            "length": summary(result.lengths),
            "groups": {} if game else {g: summary(v) for g, v in result.groups.items()},
            "agents": {a: summary(v) for a, v in result.agents.items()},
            "outcomes": {
                name: {word: rate(o == sign) for word, sign in OUTCOMES}
                for name, o in result.outcomes.items()
            },
            "env_statistics": {k.removeprefix("eval/"): v for k, v in result.info.items()},
        }
