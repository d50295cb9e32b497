"""MultiAgentRunner: steps a multi-agent vector env for every multi-agent learner.

The runner owns the env, the pending observations (per group, the global state and the
legal-action masks) and the bookkeeping of finished episodes; a learner brings its *acting*
object, which turns observations into actions for every group. MADDPG, distributed MADDPG,
CTEDD and QMIX/VDN/IQL all collect through it, so their rollouts, episode statistics and
checkpointed env state have one layout. It keeps the `EnvRunner` contract (``sample``,
``set_weights``, ``get_state``/``set_state``), so it runs in-process or in a Ray actor.

A rollout is time-major per group, DESIGN.md's ``[T, B, N, ...]``: observations
``[T + 1, B, N, ...]`` (before each step, then after the last), actions, rewards,
terminated, truncated and active ``[T, B, N]``, autoreset ``[T, B]`` and the global state
``[T + 1, B, S]``. The env's next-step autoreset convention (`shoal.envs.multi_agent`)
carries over unchanged: ``obs[t + 1]`` of an env that ended at ``t`` is its true final
observation, and step ``t + 1`` is its autoreset step.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple, Protocol, overload

import numpy as np

from shoal.core.errors import ConfigError
from shoal.core.seeding import derive_seed
from shoal.core.types import EpisodeStats, info_metrics, merge_info
from shoal.envs.multi_agent import AgentGroup, MultiAgentStep, MultiAgentVectorEnv
from shoal.envs.opponents import make_opponents
from shoal.envs.snapshot import EnvStateUnsupported


class JointObs(NamedTuple):
    """What every agent of every env sees before a step."""

    obs: dict[str, np.ndarray]
    """Per group ``[B, N, ...]``."""
    state: np.ndarray | None
    """``[B, S]`` global state, or None."""
    action_mask: dict[str, np.ndarray] | None
    """Per group ``[B, N, A]`` legal actions, or None."""


class MultiAgentActing(Protocol):
    """A learner's acting side. ``act`` returns actions ``[B, N, ...]`` for every group.
    Optional methods the runner calls when present: ``begin(view)`` when episodes (re)start
    from a reset, ``observe(actions, step)`` after each step (recurrent state, last actions),
    ``set_weights(weights)``, and ``get_state()``/``set_state(state)`` for checkpoints."""

    def act(self, view: JointObs) -> dict[str, np.ndarray]: ...


class MultiAgentEpisodes:
    """Episodes finished during a rollout: per agent returns and the lengths, aligned."""

    def __init__(
        self,
        groups: Mapping[str, AgentGroup],
        returns: dict[str, np.ndarray] | None = None,
        lengths: np.ndarray | None = None,
        info: dict[str, np.ndarray] | None = None,
    ):
        self.groups = dict(groups)
        self.info = info
        """The env's own episode statistics (`MultiAgentStep.episode_info`)."""
        agents = [a for g in self.groups.values() for a in g.agents]
        self.returns = returns or {agent: np.zeros(0) for agent in agents}
        self.lengths = np.zeros(0, np.int64) if lengths is None else lengths

    @classmethod
    def from_steps(
        cls, groups: Mapping[str, AgentGroup], steps: list[MultiAgentStep]
    ) -> MultiAgentEpisodes:
        ended = [s for s in steps if s.episode_lengths.size]
        episodes = cls(groups)
        if ended:
            episodes.returns = {
                agent: np.concatenate([s.episode_returns[agent] for s in ended]).astype(np.float64)
                for agent in episodes.returns
            }
            episodes.lengths = np.concatenate([s.episode_lengths for s in ended]).astype(np.int64)
        episodes.info = merge_info([s.episode_info for s in ended])
        return episodes

    @classmethod
    def concat(cls, parts: list[MultiAgentEpisodes]) -> MultiAgentEpisodes:
        """Several runners' episodes as one."""
        first = parts[0]
        returns = {a: np.concatenate([p.returns[a] for p in parts]) for a in first.returns}
        lengths = np.concatenate([p.lengths for p in parts])
        return cls(first.groups, returns, lengths, merge_info([p.info for p in parts]))

    @property
    def count(self) -> int:
        return int(self.lengths.size)

    def group_returns(self, group: str) -> np.ndarray:
        """``[k, N]`` returns of the group's agents."""
        agents = self.groups[group].agents
        return np.stack([self.returns[a] for a in agents], axis=1)

    def stats(self, groups: list[str] | None = None) -> EpisodeStats:
        """The episodes as `EpisodeStats` with one return per (episode, agent) of ``groups``
        (default: all), agents indexed in group order."""
        names = [a for g in groups or list(self.groups) for a in self.groups[g].agents]
        if not self.count:
            return EpisodeStats(
                np.zeros(0), np.zeros(0, np.int64), np.zeros(0, np.int64), tuple(names)
            )
        k = self.count
        return EpisodeStats(
            np.concatenate([self.returns[a] for a in names]),
            np.tile(self.lengths, len(names)),
            np.repeat(np.arange(len(names)), k),
            tuple(names),
        )

    def metrics(self, groups: list[str] | None = None) -> dict[str, float]:
        """``episode/return`` (mean over agents and episodes), ``episode/length``,
        ``episode/count`` (agent episodes), ``episode/return/<agent>`` and, with several
        groups, ``episode/return/<group>`` (mean over the group's agents), of ``groups``
        (default: all; the learning ones where others act by fixed policies); empty when no
        episode ended."""
        groups = groups or list(self.groups)
        metrics = self.stats(groups).metrics()
        metrics.update(info_metrics(self.info))
        if metrics and len(groups) > 1:
            for name in groups:
                metrics[f"episode/return/{name}"] = float(self.group_returns(name).mean())
        return metrics


class MultiAgentRollout(NamedTuple):
    """``T`` vector steps of every group (see the module doc for the shapes)."""

    obs: dict[str, np.ndarray]
    state: np.ndarray | None
    action_mask: dict[str, np.ndarray] | None
    actions: dict[str, np.ndarray]
    rewards: dict[str, np.ndarray]
    terminated: dict[str, np.ndarray]
    truncated: dict[str, np.ndarray]
    active: dict[str, np.ndarray]
    autoreset: np.ndarray
    episodes: MultiAgentEpisodes

    @property
    def num_steps(self) -> int:
        return int(self.autoreset.shape[0])

    @property
    def num_envs(self) -> int:
        return int(self.autoreset.shape[1])

    def view(self, t: int) -> JointObs:
        """What the agents saw before step ``t`` (``t = T``: after the last step)."""
        masks = None if self.action_mask is None else {g: m[t] for g, m in self.action_mask.items()}
        return JointObs(
            {g: o[t] for g, o in self.obs.items()},
            None if self.state is None else self.state[t],
            masks,
        )

    def step(self, t: int) -> MultiAgentStep:
        """Step ``t`` as the env returned it (observations after it; no episode returns)."""
        after = self.view(t + 1)
        return MultiAgentStep(
            obs=after.obs,
            rewards={g: r[t] for g, r in self.rewards.items()},
            terminated={g: x[t] for g, x in self.terminated.items()},
            truncated={g: x[t] for g, x in self.truncated.items()},
            active={g: x[t] for g, x in self.active.items()},
            autoreset=self.autoreset[t],
            state=after.state,
            episode_returns={},
            episode_lengths=np.zeros(0, np.int64),
            action_mask=after.action_mask,
        )


class MultiAgentRunner:
    """Steps ``env`` ``num_steps`` times per `sample` with ``acting``'s actions.

    Args:
        env: the multi-agent vector env (the runner closes it).
        acting: the learner's acting side (`MultiAgentActing`).
        num_steps: vector steps per rollout (``T``).
        seed: seed of the first reset.
    """

    def __init__(
        self, env: MultiAgentVectorEnv, acting: MultiAgentActing, num_steps: int, seed: int
    ):
        self.env, self.num_steps = env, num_steps
        self.acting: Any = acting  # its optional members are looked up (MultiAgentActing)
        self.groups = env.groups
        self.view = self._reset(seed)

    @property
    def num_envs(self) -> int:
        return self.env.num_envs

    def _reset(self, seed: int) -> JointObs:
        obs, state = self.env.reset(seed=seed)
        view = JointObs(obs, state, _copy(getattr(self.env, "action_mask", None)))
        if hasattr(self.acting, "begin"):
            self.acting.begin(view)
        return view

    def sample(self) -> MultiAgentRollout:
        """``num_steps`` vector steps; the rollout and its finished episodes."""
        steps: list[MultiAgentStep] = []
        actions: list[dict[str, np.ndarray]] = []
        views = [self.view]
        observe = getattr(self.acting, "observe", None)
        for _ in range(self.num_steps):
            chosen = self.acting.act(self.view)
            missing = [g for g in self.groups if g not in chosen]
            if missing:
                raise ConfigError(f"the acting policies gave no actions for groups {missing}")
            step = self.env.step(chosen)
            # Envs may reuse their arrays from step to step: keep copies.
            step = _copy_step(step)
            chosen = {g: np.array(a, copy=True) for g, a in chosen.items()}
            if observe is not None:
                observe(chosen, step)
            self.view = JointObs(step.obs, step.state, step.action_mask)
            steps.append(step)
            actions.append(chosen)
            views.append(self.view)
        return self._rollout(views, actions, steps)

    def _rollout(
        self, views: list[JointObs], actions: list[dict], steps: list[MultiAgentStep]
    ) -> MultiAgentRollout:
        groups = list(self.groups)
        masked = views[0].action_mask is not None
        states: list[Any] = [v.state for v in views]  # all arrays, or all None

        def stacked(items: list[Any]) -> dict[str, np.ndarray]:  # per-step dicts by group
            return {g: np.stack([item[g] for item in items]) for g in groups}

        return MultiAgentRollout(
            obs=stacked([v.obs for v in views]),
            state=None if states[0] is None else np.stack(states),
            action_mask=stacked([v.action_mask for v in views]) if masked else None,
            actions=stacked(actions),
            rewards=stacked([s.rewards for s in steps]),
            terminated=stacked([s.terminated for s in steps]),
            truncated=stacked([s.truncated for s in steps]),
            active=stacked([s.active for s in steps]),
            autoreset=np.stack([s.autoreset for s in steps]),
            episodes=MultiAgentEpisodes.from_steps(self.groups, steps),
        )

    num_runners = 1
    last_restarted: tuple[int, ...] = ()
    """In-process: no runner is ever rebuilt (`shoal.collect.multi_agent_ray`'s sampler's)."""

    def restarted_envs(self) -> list[int]:
        """The envs whose runner was rebuilt during the last `sample`: none here."""
        return []

    def set_weights(self, weights: Any) -> None:
        self.acting.set_weights(weights)

    def set_acting(self, name: str, value: Any) -> None:
        """Set attribute ``name`` of the acting side (QMIX's epsilon)."""
        setattr(self.acting, name, value)

    def get_state(self) -> dict[str, Any]:
        """Env state (None when the env cannot save it), the pending observations and the
        acting side's state: the one checkpoint layout of multi-agent collection."""
        try:
            env_state = self.env.get_state()
        except EnvStateUnsupported:  # e.g. PettingZoo envs: episodes restart on resume
            env_state = None
        view = self.view
        state: dict[str, Any] = {
            "env": env_state,
            "obs": _copy(view.obs),
            "state": None if view.state is None else view.state.copy(),
            "action_mask": _copy(view.action_mask),
        }
        if hasattr(self.acting, "get_state"):
            state["acting"] = self.acting.get_state()
        return state

    def set_state(self, state: dict[str, Any], fallback_seed: int) -> bool:
        """Restore mid-episode state; returns False when the env could not be saved and its
        episodes restarted from a reset with ``fallback_seed`` instead."""
        if "acting" in state:
            self.acting.set_state(state["acting"])
        if state["env"] is None:
            self.view = self._reset(fallback_seed)
            return False
        self.env.set_state(state["env"])
        saved_state = state["state"]
        self.view = JointObs(
            _copy(state["obs"]),
            None if saved_state is None else np.array(saved_state, copy=True),
            _copy(state["action_mask"]),
        )
        return True

    def close(self) -> None:
        self.env.close()


@overload
def _copy(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...


@overload
def _copy(arrays: None) -> None: ...


def _copy(arrays: dict[str, np.ndarray] | None) -> dict[str, np.ndarray] | None:
    return None if arrays is None else {k: np.array(v, copy=True) for k, v in arrays.items()}


def _copy_step(step: MultiAgentStep) -> MultiAgentStep:
    return step._replace(
        obs=_copy(step.obs),
        rewards=_copy(step.rewards),
        terminated=_copy(step.terminated),
        truncated=_copy(step.truncated),
        active=_copy(step.active),
        autoreset=np.array(step.autoreset, copy=True),
        state=None if step.state is None else np.array(step.state, copy=True),
        action_mask=_copy(step.action_mask),
    )


class FixedGroups:
    """The groups of a multi-agent run that act by fixed policies (``env.opponents``:
    random or scripted, `shoal.envs.opponents`), each seeded from the run's ``seed`` with a
    generator of its own; their state goes into the acting side's checkpoint state."""

    def __init__(self, specs: Mapping[str, str], groups: Mapping[str, AgentGroup], seed: int):
        self.players = make_opponents(specs, groups, None)
        for index, player in enumerate(self.players.values()):
            if hasattr(player, "reset"):
                player.reset(derive_seed(seed, "opponent", index))

    @classmethod
    def for_runner(
        cls, specs: Mapping[str, str], groups: Mapping[str, AgentGroup], seed: int, index: int
    ) -> FixedGroups:
        """Runner ``index``'s fixed groups: seeded from the run's ``seed`` on runner 0 (the
        in-process runner) and from a seed of their own on the others."""
        return cls(specs, groups, seed if index == 0 else derive_seed(seed, "opponents", index))

    def __len__(self) -> int:
        return len(self.players)

    def act(self, view: JointObs) -> dict[str, np.ndarray]:
        """Actions ``[B, N, ...]`` of every fixed group (legal ones, where masks are known)."""
        masks = view.action_mask
        return {
            group: player.act(view.obs[group], None if masks is None else masks[group])
            for group, player in self.players.items()
        }

    def get_state(self) -> dict[str, Any]:
        return {g: p.get_state() for g, p in self.players.items() if hasattr(p, "get_state")}

    def set_state(self, state: dict[str, Any]) -> None:
        for group, player_state in state.items():
            self.players[group].set_state(player_state)
