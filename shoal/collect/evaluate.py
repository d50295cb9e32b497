"""Evaluation of a policy on environments separate from training (the training loop's
periodic and final evaluations, `shoal eval`, and algorithms' own scores): returns and
lengths of the first episode of every env, and the env's own episode statistics
(``eval/<name>``, e.g. a traffic env's ``eval/collision_rate``) of those episodes. Actions
are the policy's deterministic ones (the mode, argmax or mean) unless sampled: sampled
actions come from torch's generators seeded from the evaluation's seed (`seeded_sampling`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from shoal.core.interfaces import Policy
from shoal.core.seeding import derive_seed
from shoal.core.stats import bootstrap_ci
from shoal.core.types import info_metrics
from shoal.envs.base import VectorEnv
from shoal.envs.multi_agent import MultiAgentVectorEnv, episode_ended
from shoal.nn.policy import JointPolicy


@dataclass
class Episodes:
    """The first episode of every env of an evaluation, one sample per episode: ``returns``
    and ``lengths`` ``[n]`` (with several agents, the mean over them: over opposing groups
    only a bookkeeping figure, so reports show ``groups`` instead), each agent's and group's
    returns ``{name: [n]}`` where the env has agents, the env's own statistics
    (``eval/<name>`` means), and for games ``outcomes``: ``{seat or group: [n]}`` of 1 (won),
    0 (drawn) and -1 (lost), by the sign of its return (`game_outcomes`)."""

    returns: np.ndarray
    lengths: np.ndarray
    agents: dict[str, np.ndarray] = field(default_factory=dict)
    groups: dict[str, np.ndarray] = field(default_factory=dict)
    info: dict[str, float] = field(default_factory=dict)
    outcomes: dict[str, np.ndarray] = field(default_factory=dict)

    def metrics(self) -> dict[str, float]:
        """What the loop logs: ``eval/return`` (mean), ``_std``, ``_min``, ``eval/length``,
        ``eval/return/<group>`` and ``eval/return/<agent>`` where the env has agents (with
        several groups each group's 95% bootstrap interval over episodes,
        ``eval/return_low/<group>`` and ``eval/return_high/<group>``), the env's
        statistics, and a game's ``eval/win/<name>``, ``eval/draw/<name>`` and
        ``eval/loss/<name>`` rates."""
        metrics = {
            "eval/return": float(self.returns.mean()),
            "eval/return_std": float(self.returns.std()),
            "eval/return_min": float(self.returns.min()),
            "eval/length": float(self.lengths.mean()),
            **self.info,
        }
        for name, values in {**self.groups, **self.agents}.items():  # per group and agent
            metrics[f"eval/return/{name}"] = float(values.mean())
        if len(self.groups) > 1:  # opposing groups: each with its interval over episodes
            for name, values in self.groups.items():
                low, high = bootstrap_ci(values)
                metrics[f"eval/return_low/{name}"], metrics[f"eval/return_high/{name}"] = low, high
        for name, outcome in self.outcomes.items():
            for word, sign in (("win", 1), ("draw", 0), ("loss", -1)):
                metrics[f"eval/{word}/{name}"] = float(np.mean(outcome == sign))
        return metrics


def game_outcomes(
    agents: dict[str, np.ndarray], groups: dict[str, np.ndarray], turn_based: bool
) -> dict[str, np.ndarray]:
    """Each seat's (agent's) and, with several groups, each group's outcome per episode,
    1 / 0 / -1 by the sign of its return, for games: a turn-based env, or one whose every
    episode is zero-sum over the agents with some return not zero (a cooperative team whose
    returns are all 0 is no game). Other envs have none (``{}``)."""
    if len(agents) < 2:
        return {}
    every = np.stack(list(agents.values()), axis=1)  # [n, agents]
    zero_sum = np.all(np.abs(every.sum(1)) <= 1e-6 * (1.0 + np.abs(every).sum(1)))
    if not (turn_based or (zero_sum and np.any(every != 0))):
        return {}
    outcomes = {name: np.sign(values).astype(np.int64) for name, values in agents.items()}
    if len(groups) > 1:
        outcomes.update({name: np.sign(values).astype(np.int64) for name, values in groups.items()})
    return outcomes


@contextlib.contextmanager
def seeded_sampling(seed: int, deterministic: bool) -> Iterator[None]:
    """For a sampled evaluation (``deterministic`` False): torch's generators (the CPU's, and
    the GPUs' this process has started) seeded from ``seed`` inside, and restored on leaving.
    The same seed then gives the same episodes, and the caller's random streams, a training
    run's, come out as they went in: an evaluation does not change what training draws next."""
    if deterministic:
        yield
        return
    gpus = torch.cuda.is_available() and torch.cuda.is_initialized()
    with torch.random.fork_rng(devices=range(torch.cuda.device_count()) if gpus else []):
        torch.manual_seed(derive_seed(seed, "actions"))
        yield


def evaluate(
    policy: Policy, env: VectorEnv, seed: int, deterministic: bool = True
) -> dict[str, float]:
    """Run the first episode of every env in ``env`` (one episode per parallel env).

    Taking exactly the first episode of each env avoids the bias of counting whichever episodes
    finish first, which would favour short (often bad) episodes.
    """
    return evaluate_episodes(policy, env, seed, deterministic).metrics()


def evaluate_episodes(
    policy: Policy,
    env: VectorEnv,
    seed: int,
    deterministic: bool = True,
    progress: Callable[[int], None] | None = None,
) -> Episodes:
    """`evaluate`'s episodes themselves. Rows of agents (`AgentsAsBatch`) give each row's
    first episode, and each agent's returns over the envs. ``progress`` is told the count of
    finished episodes after each step (`shoal.train.progress.Countdown`)."""
    n = env.num_envs
    names = getattr(env, "agent_names", None)
    rows_per_episode = 1 if names is None else len(names)
    returns = np.full(n, np.nan)
    lengths = np.zeros(n, np.int64)
    info = FirstEpisodeInfo(n)
    with seeded_sampling(seed, deterministic):
        obs = env.reset(seed=seed)
        while np.isnan(returns).any():
            mask = getattr(env, "action_mask", None)  # legal actions, where the env reports them
            if mask is None:
                actions = policy.act(obs, deterministic=deterministic)
            else:
                masked: Any = policy  # a policy of a masked env takes the masks
                actions = masked.act(obs, deterministic=deterministic, action_mask=mask)
            result = env.step(actions)
            done = np.flatnonzero(result.terminated | result.truncated)
            fresh = np.isnan(returns[done])
            returns[done[fresh]] = result.episode_returns[fresh]
            lengths[done[fresh]] = result.episode_lengths[fresh]
            if result.episode_info is not None and result.episode_info_rows is not None:
                info.add(result.episode_info, result.episode_info_rows)
            obs = result.obs
            if progress is not None:
                progress(int(n - np.isnan(returns).sum()) // rows_per_episode)
    agents = {}
    if names is not None:  # rows of agents: row r is agent r % agents_per_env
        per_env = returns.reshape(-1, len(names))
        agents = {name: per_env[:, i] for i, name in enumerate(names)}
        # One sample per episode (env), not per row: an interval over n envs x N agents
        # would count N correlated agents of one episode as N episodes.
        returns = per_env.mean(axis=1)
        lengths = lengths.reshape(-1, len(names)).max(axis=1)
    return Episodes(returns, lengths.astype(np.float64), agents=agents, info=info.metrics())


class FirstEpisodeInfo:
    """The env's episode statistics of the first episode of each of ``n`` envs (or rows)."""

    def __init__(self, n: int) -> None:
        self.seen = np.zeros(n, bool)
        self.values: dict[str, list[np.ndarray]] = {}

    def add(self, info: dict[str, np.ndarray], index: np.ndarray) -> None:
        """``info`` of the episodes that ended in envs (or rows) ``index``."""
        first = ~self.seen[index]
        self.seen[index] = True
        for name, values in info.items():
            self.values.setdefault(name, []).append(np.asarray(values, np.float64)[first])

    def metrics(self) -> dict[str, float]:
        renamed = info_metrics({n: np.concatenate(v) for n, v in self.values.items()})
        return {"eval/" + name.removeprefix("episode/"): v for name, v in renamed.items()}


def evaluate_joint(
    policy: JointPolicy, env: MultiAgentVectorEnv, seed: int, deterministic: bool = True
) -> dict[str, float]:
    """`evaluate` for the policies of every group of a multi-agent env at once: the first
    episode of every env. ``eval/return`` is the mean over envs and agents (as `evaluate`
    reports it on rows of agents); ``eval/return/<group>`` and ``eval/return/<agent>`` break
    it down."""
    return evaluate_joint_episodes(policy, env, seed, deterministic).metrics()


def evaluate_joint_episodes(
    policy: JointPolicy,
    env: MultiAgentVectorEnv,
    seed: int,
    deterministic: bool = True,
    progress: Callable[[int], None] | None = None,
) -> Episodes:
    """`evaluate_joint`'s episodes themselves: per env, the mean return over all agents, and
    each group's (mean over its agents) and agent's returns. ``progress`` is told the count
    of finished envs after each step."""
    n = env.num_envs
    totals = {g: np.zeros((n, group.size)) for g, group in env.groups.items()}
    lengths = np.zeros(n, np.int64)
    running = np.ones(n, bool)
    info = FirstEpisodeInfo(n)
    with seeded_sampling(seed, deterministic):
        obs, state = env.reset(seed=seed)
        mask = getattr(env, "action_mask", None)
        while running.any():
            actions = policy.act(obs, deterministic=deterministic, state=state, action_mask=mask)
            step = env.step(actions)
            real = running & ~step.autoreset
            lengths += real
            for g, total in totals.items():
                total[real] += step.rewards[g][real]
            ended = episode_ended(step)
            if step.episode_info is not None:
                info.add(step.episode_info, np.flatnonzero(ended))
            running &= ~ended
            obs, state, mask = step.obs, step.state, step.action_mask
            if progress is not None:
                progress(int(n - running.sum()))
    every = np.concatenate(list(totals.values()), axis=1)
    groups = {g: total.mean(axis=1) for g, total in totals.items()}
    agents = {
        agent: totals[g][:, index]
        for g, group in env.groups.items()
        for index, agent in enumerate(group.agents)
    }
    sums = {g: total.sum(axis=1) for g, total in totals.items()}
    outcomes = game_outcomes(agents, sums, bool(getattr(env, "turn_based", False)))
    return Episodes(
        every.mean(axis=1), lengths.astype(np.float64), agents, groups, info.metrics(), outcomes
    )
