"""Deployable policies: numpy observations in, numpy actions out."""

from __future__ import annotations

import copy
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from shoal.core.errors import ShoalError
from shoal.envs.composite import PackedActions, PackedObs, map_leaves
from shoal.envs.normalize import FieldStats, RunningMeanStd, load_obs_stats, normalize
from shoal.envs.opponents import make_opponent
from shoal.nn.policy_set import takes_mask


class ActorPolicy:
    """A trained actor plus the observation statistics it was trained with (frozen).

    ``model`` must provide ``distribution(obs)`` returning an action distribution with
    ``mode()`` and ``sample()`` (every shoal policy network does). Used by evaluation,
    ``shoal eval`` and ``shoal.load``.
    """

    def __init__(
        self,
        model: nn.Module,
        obs_stats: dict[str, Any] | None = None,
        clip_obs: float = 10.0,
        config: Any = None,
        observation_space: gym.Space | None = None,
        action_space: gym.Space | None = None,
    ):
        network: Any = model.cpu().eval()  # a network with distribution(obs[, mask])
        self.model = network
        self.config = config
        """The training config, when loaded from a run (``shoal.load``)."""
        self.observation_space = observation_space
        """What one observation looks like, when known (``shoal.load``): `act` then also
        takes a single observation, and names the expected shape when given another."""
        self.action_space = action_space
        self.obs_stats: RunningMeanStd | FieldStats | None = None
        if obs_stats is not None:
            self.obs_stats = load_obs_stats(obs_stats)
        self.clip_obs = clip_obs
        self.takes_mask = takes_mask(self.model)
        """Whether the model restricts its policy to legal actions (others ignore masks)."""

    @torch.inference_mode()
    def act(
        self,
        obs: np.ndarray,
        deterministic: bool = True,
        episode_start: np.ndarray | None = None,
        action_mask: np.ndarray | None = None,
    ) -> np.ndarray:
        """Actions for a batch of observations ``[B, ...]``, or the action for a single
        observation (when the policy knows its observation space, as ``shoal.load``'s does).
        Dict and Tuple observations come as the env gives them: a (nested) dict or tuple of
        one observation's parts, or of arrays ``[B, ...]`` for a batch.

        ``episode_start`` ``[B]`` (bool): True where ``obs`` is the first observation of a
        new episode. A recurrent policy (LSTM actor-critic, QMIX's GRU agents) starts those
        rows from a zero state; without it, its state runs on from the previous call (zero at
        the first call and when ``B`` changes). Feed-forward policies ignore it.

        ``action_mask`` ``[B, A]`` (bool; one row for a single observation): the legal
        actions, for Discrete and MultiDiscrete policies (one column per value of each
        sub-action) and DQN's Q-networks; the policy acts only among them."""
        space = self.observation_space
        if isinstance(space, PackedObs) and isinstance(obs, (dict, tuple)):
            single = space.is_single(obs)  # a Dict/Tuple observation: pack it as stored
            obs = space.pack_one(obs)[None] if single else space.pack(obs)
        else:
            single = self._is_single(obs)
            if single:
                obs = np.asarray(obs)[None]
        if single and episode_start is not None:
            episode_start = np.asarray(episode_start).reshape(1)
        if episode_start is not None and hasattr(self.model, "reset_state"):
            self.model.reset_state(torch.as_tensor(np.asarray(episode_start), dtype=torch.bool))
        if self.obs_stats is not None:
            obs = normalize(obs, self.obs_stats, self.clip_obs)
        if action_mask is None or not self.takes_mask:
            dist = self.model.distribution(torch.as_tensor(obs))
        else:
            mask = torch.as_tensor(np.asarray(action_mask, bool)).reshape(len(obs), -1)
            dist = self.model.distribution(torch.as_tensor(obs), mask)
        actions = (dist.mode() if deterministic else dist.sample()).numpy()
        if isinstance(self.action_space, PackedActions):  # the env's Tuple/Dict actions
            nested = self.action_space.unpack(actions)
            return map_leaves(nested, lambda value: value[0]) if single else nested
        return actions[0] if single else actions

    def _is_single(self, obs: Any) -> bool:
        """Whether ``obs`` is one observation rather than a batch; refuses anything else with
        the shapes it expected."""
        space = self.observation_space
        if space is None or not isinstance(space, (gym.spaces.Box, gym.spaces.Discrete,
                                                   gym.spaces.MultiBinary,
                                                   gym.spaces.MultiDiscrete)):  # fmt: skip
            return False
        shape = np.shape(obs)
        assert space.shape is not None  # these four spaces have shapes
        if shape == space.shape:
            return True
        if shape[1:] == space.shape and len(shape) == len(space.shape) + 1:
            return False
        batch = "(B" + "".join(f", {size}" for size in space.shape) + ")"
        raise ShoalError(
            f"policy.act expects one observation of shape {space.shape} or a batch of shape "
            f"{batch}, got an array of shape {shape}"
        )


class JointPolicy:
    """The trained policies of every agent group of a multi-agent env, acting together
    (decentralized: each agent on its own observation). ``model`` provides
    ``act_joint({group: obs}, deterministic)`` (`shoal.nn.multi_agent.JointActors`)."""

    def __init__(self, model: nn.Module, config: Any = None):
        team: Any = model.cpu().eval()  # a team network with groups and act_joint
        self.model = team
        self.config = config
        self.groups = list(team.groups)
        self.fixed: dict[str, Any] = {}
        """Groups that act by a fixed policy instead of the trained one (`with_fixed`)."""

    def with_fixed(self, specs: dict[str, str], groups: dict[str, Any]) -> JointPolicy:
        """This policy with some groups or single agents acting by fixed policies instead,
        ``{group or agent id: spec}`` (``random`` or ``module:Class``, built as
        `shoal.envs.opponents` builds them from the env's ``groups``): how a trained team
        fares against a random or scripted opponent, or one seat of a board game against a
        scripted player."""
        other = JointPolicy(self.model, self.config)
        other.fixed = {**self.fixed, **fixed_players(specs, groups)}
        return other

    @torch.inference_mode()
    def act(
        self,
        obs: dict[str, np.ndarray],
        deterministic: bool = True,
        state: np.ndarray | None = None,
        action_mask: dict[str, np.ndarray] | None = None,
    ) -> dict[str, np.ndarray]:
        """Actions per group for observations per group, ``{group: [B, N, ...]}`` (a batch of
        envs) or ``{group: [N, ...]}`` (one env). ``state`` (``[B, S]``, or ``[S]``) is the
        env's global state, which centralized critics were trained on (policies never need
        it); ``action_mask`` ``{group: [B, N, A]}`` the legal actions, where the env has them."""
        missing = [g for g in self.groups if g not in obs]
        if missing:
            raise ShoalError(
                f"policy.act needs the observations of every group {self.groups}; missing {missing}"
            )
        first = self.groups[0]
        space = getattr(self.model.groups[first], "observation_space", None)
        rank = 1 if space is None else len(space.shape)  # MADDPG's actors: 1-D observations
        single = np.ndim(obs[first]) == 1 + rank  # [N, ...]: one env's agents

        def batched(x: np.ndarray) -> torch.Tensor:
            x = np.asarray(x)
            return torch.as_tensor(x[None] if single else x)

        extras: dict[str, Any] = {}
        if state is not None:
            extras["state"] = batched(np.asarray(state, np.float32))
        if action_mask is not None:
            extras["action_mask"] = {g: batched(m) for g, m in action_mask.items()}
        tensors = {g: batched(np.asarray(obs[g], np.float32)) for g in self.groups}
        actions = self.model.act_joint(tensors, deterministic=deterministic, **extras)
        out = {g: a.numpy() for g, a in actions.items()}  # [B, N, ...]
        masks = (
            None
            if action_mask is None
            else {g: m.numpy() for g, m in extras["action_mask"].items()}
        )
        out = play_fixed(out, self.fixed, {g: t.numpy() for g, t in tensors.items()}, masks)
        return {g: a[0] if single else a for g, a in out.items()}


class GroupPolicy:
    """A policy trained on rows of agents (one group of a multi-agent env, `AgentsAsBatch`:
    PPO, A2C, DQN, ... on ``shoal/intersection-v0`` or tic-tac-toe) acting through
    `JointPolicy`'s interface, ``{group: [B, N, ...]}`` in and out, so that evaluation counts
    episodes (not rows), reports every group and seat, and can set fixed players in place of
    trained agents. Rows are built as training built them (the one-hot agent index, the
    global state); the run's ``env.opponents`` play the other groups."""

    def __init__(self, policy: ActorPolicy, groups: dict[str, Any], state_space: gym.Space | None):
        from shoal.envs.agents_as_batch import AgentRows
        from shoal.envs.opponents import make_opponents

        env = policy.config.env
        learners = [g for g in groups if g not in env.opponents]
        self.group = env.group or (learners[0] if len(learners) == 1 else "")
        if self.group not in groups:
            raise ShoalError(f"this run trained group {self.group!r}; the env has {list(groups)}")
        spec = groups[self.group]
        self.policy, self.config = policy, policy.config
        self.groups = [self.group]
        self.layout = AgentRows(
            spec.observation_space, spec.size, state_space, env.agent_id, env.global_state
        )
        self.opponents = make_opponents(env.opponents, groups, self.group)
        for i, opponent in enumerate(self.opponents.values()):
            if hasattr(opponent, "reset"):
                opponent.reset(104_729 * (i + 1))
        self.fixed: dict[str, Any] = {}

    def with_fixed(self, specs: dict[str, str], groups: dict[str, Any]) -> GroupPolicy:
        """As `JointPolicy.with_fixed`: a fixed player for the trained group (a scripted
        driver for every agent), one of its agents (a seat), or an opponent group."""
        other = copy.copy(self)
        other.fixed = {**self.fixed, **fixed_players(specs, groups)}
        return other

    def act(
        self,
        obs: dict[str, np.ndarray],
        deterministic: bool = True,
        state: np.ndarray | None = None,
        action_mask: dict[str, np.ndarray] | None = None,
    ) -> dict[str, np.ndarray]:
        """Actions per group for a batch of envs' observations ``{group: [B, N, ...]}``."""
        own = np.asarray(obs[self.group])
        batch, agents = own.shape[:2]
        rows = self.layout.rows(own, state)
        mask = None if action_mask is None else action_mask[self.group].reshape(batch * agents, -1)
        actions = self.policy.act(rows, deterministic=deterministic, action_mask=mask)
        space = self.policy.action_space
        shape = space.shape if space is not None and space.shape is not None else ()
        out = {self.group: np.asarray(actions).reshape(batch, agents, *shape)}
        for name, opponent in self.opponents.items():
            out[name] = opponent.act(obs[name], None if action_mask is None else action_mask[name])
        return play_fixed(out, self.fixed, obs, action_mask)


def fixed_players(specs: dict[str, Any], groups: dict[str, Any]) -> dict[str, tuple]:
    """``{group or agent id: spec}`` -> ``{key: (group, seat or None, player)}``, each
    player built from its group's spaces (`shoal.envs.opponents`), or given built (an object
    with ``act(obs, action_mask)``); an unknown name is one error naming the env's groups and
    agents."""
    agents = {a: (g.name, i) for g in groups.values() for i, a in enumerate(g.agents)}
    unknown = [k for k in specs if k not in groups and k not in agents]
    if unknown:
        raise ShoalError(
            f"no groups or agents {unknown} in this env; its groups: {list(groups)}, "
            f"agents: {list(agents)}"
        )
    players = {}
    for index, (key, spec) in enumerate(specs.items()):
        group, seat = (key, None) if key in groups else agents[key]
        g = groups[group]
        if isinstance(spec, str):
            player = make_opponent(group, spec, g.observation_space, g.action_space)
        else:
            player = spec
        if hasattr(player, "reset"):
            player.reset(index)
        players[key] = (group, seat, player)
    return players


def play_fixed(
    actions: dict[str, np.ndarray],
    fixed: dict[str, tuple],
    obs: dict[str, np.ndarray],
    masks: dict[str, np.ndarray] | None,
) -> dict[str, np.ndarray]:
    """``actions`` ``{group: [B, N, ...]}`` with the fixed players' actions in place of
    their group's (or their seat's)."""
    for group, seat, player in fixed.values():
        mask = None if masks is None else masks[group]
        chosen = np.asarray(player.act(np.asarray(obs[group], np.float32), mask))
        if seat is None:
            actions[group] = chosen
        else:
            actions[group] = np.array(actions[group], copy=True)
            actions[group][:, seat] = chosen[:, seat]
    return actions
