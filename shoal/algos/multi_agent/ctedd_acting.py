"""CTEDD's acting parts (Chen 2019, `shoal.algos.multi_agent.ctedd`): the global policies'
CPU copies that drive the `MultiAgentRunner` while the learner trains on its own device, and a
team's policies as the shared evaluation (`shoal.collect.evaluate.evaluate_joint`) plays them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from shoal.collect.multi_agent import FixedGroups, JointObs, MultiAgentRunner
from shoal.core.errors import ConfigError, ShoalError
from shoal.core.seeding import derive_seed
from shoal.envs.make import make_multi_agent_env
from shoal.envs.multi_agent import AgentGroup, MultiAgentStep, MultiAgentVectorEnv
from shoal.envs.shapes import shape_of
from shoal.fast.backend import uncompiled_copy
from shoal.nn.local_policies import ExplorationScale, GlobalActor


def global_actor(config: Any, num_agents: int, action_dim: int, state_dim: int) -> GlobalActor:
    """The global policies on the ``state_dim`` global state (``config``: a
    `shoal.algos.multi_agent.ctedd.CTEDDConfig`)."""
    cfg = config
    return GlobalActor(state_dim, action_dim, num_agents, cfg.global_hidden, cfg.local_hidden)


def exploration_scale(config: Any, actor: GlobalActor) -> ExplorationScale:
    """The exploration scales of ``actor``'s policies, on its features."""
    cfg = config
    return ExplorationScale(
        actor.feature_dim, actor.action_dim, actor.num_agents, cfg.local_hidden,
        cfg.sigma_min, cfg.sigma_max, cfg.sigma_init,
    )  # fmt: skip


def acting_weights(actor: GlobalActor, scale: ExplorationScale) -> dict[str, Any]:
    """What `CTEDDActing.set_weights` takes: the policies' and the scales' weights, on the
    CPU where acting runs."""
    return {
        "actor": {k: v.detach().cpu() for k, v in actor.state_dict().items()},
        "scale": {k: v.detach().cpu() for k, v in scale.state_dict().items()},
    }


class CTEDDActing:
    """The acting side of the `MultiAgentRunner`: CPU copies of the global policies (their
    weights handed over once per iteration, so acting never waits on the learner's device)
    on the global state, sampling ``mu(s) + sigma(s) * eps`` (uniformly before learning
    starts); keeps the states and the samples of the real steps for the exploration update
    (Eq. (5))."""

    def __init__(self, actor: GlobalActor, scale: ExplorationScale, group: str, opponents: Any):
        self.actor = uncompiled_copy(actor).requires_grad_(False)
        self.scale = uncompiled_copy(scale).requires_grad_(False)
        self.group, self.opponents = group, opponents
        self.states: list[torch.Tensor] = []
        self.sampled: list[torch.Tensor] = []
        self._pending: tuple[torch.Tensor, torch.Tensor] | None = None

    def set_weights(self, weights: dict[str, dict[str, torch.Tensor]]) -> None:
        """The learner's current global policies (and its random-action switch), as
        `acting_weights` gives them."""
        with torch.no_grad():
            for name, copy in (("actor", self.actor), ("scale", self.scale)):
                own, theirs = copy.state_dict(keep_vars=True), weights[name]
                torch._foreach_copy_(list(own.values()), [theirs[k] for k in own])

    @torch.inference_mode()
    def act(self, view: JointObs) -> dict[str, np.ndarray]:
        state = torch.as_tensor(view.state, dtype=torch.float32)
        actor = self.actor
        if actor.random_actions:
            raw = torch.rand(state.shape[0], actor.num_agents, actor.action_dim) * 2 - 1
        else:
            mean = actor(state)
            raw = mean + self.scale(actor.features(state)) * torch.randn(mean.shape)
        self._pending = (state, raw)
        return {self.group: raw.clamp(-1.0, 1.0).numpy(), **self.opponents.act(view)}

    def observe(self, actions: dict[str, np.ndarray], step: MultiAgentStep) -> None:
        assert self._pending is not None, "observe() follows act()"
        state, raw = self._pending
        valid = torch.from_numpy(~step.autoreset)
        self.states.append(state[valid])
        self.sampled.append(raw[valid])

    def get_state(self) -> dict[str, Any]:
        return {"opponents": self.opponents.get_state()}

    def set_state(self, state: dict[str, Any]) -> None:
        self.opponents.set_state(state["opponents"])

    def drain(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The states and samples of the real steps since the last call."""
        states, sampled = torch.cat(self.states), torch.cat(self.sampled)
        self.states, self.sampled = [], []
        return states, sampled


class Team(nn.Module):
    """A team's policies among an env's ``groups``, as `shoal.nn.policy.JointPolicy` drives them
    in `shoal.collect.evaluate.evaluate_joint`: ``act(obs, state)`` gives the team's actions
    ``[B, N, d]`` from its observations ``[B, N, o]`` and the global state ``[B, S]``; the
    other groups act by the fixed policies `JointPolicy.with_fixed` gives them."""

    def __init__(
        self,
        team: str,
        groups: list[str],
        act: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    ):
        super().__init__()
        self.team = team
        self.groups = dict.fromkeys(groups)  # the env's groups, as JointPolicy reads them
        self.act = act

    def act_joint(
        self,
        obs: dict[str, torch.Tensor],
        deterministic: bool = True,
        state: torch.Tensor | None = None,
        action_mask: dict[str, torch.Tensor] | None = None,
    ) -> dict[str, torch.Tensor]:
        if state is None:
            raise ShoalError(f"team {self.team!r} acts on the env's global state: pass state=")
        return {self.team: self.act(obs[self.team].float(), state)}


def team_of(env: MultiAgentVectorEnv, opponents: dict[str, str] | None = None) -> AgentGroup:
    """The cooperative team CTEDD trains: the env's one group without a fixed policy
    (``env.opponents``)."""
    if env.state_space is None:
        raise ConfigError("CTEDD trains one agent group of an env with a global state")
    team = [g for g in env.groups.values() if g.name not in (opponents or {})]
    if len(team) != 1:
        others = " ".join(f"{g} random" for g in list(env.groups)[1:])
        raise ConfigError(
            f"CTEDD trains one cooperative team; this env has groups {list(env.groups)}: give "
            f"the others a fixed policy (--env.opponents {others}, or a scripted "
            "module:Class), or train every group with maddpg, mappo or ippo"
        )
    group = team[0]
    space = group.action_space
    if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
        raise ConfigError(
            f"CTEDD needs continuous (1-D Box) actions, got {space}: set env.kwargs continuous"
        )
    return group


def build_runner(config: Any, index: int) -> MultiAgentRunner:
    """Runner ``index`` of a run on Ray runners: its own env, seeded as env ``index`` of the
    run, and its own copies of the global policies (weights from every ``set_weights``)."""
    env = make_multi_agent_env(config.env)
    group = team_of(env, config.env.opponents)
    assert env.state_space is not None  # team_of refuses an env without one
    state_dim = int(shape_of(env.state_space)[0])
    actor = global_actor(config, group.size, shape_of(group.action_space)[0], state_dim)
    seed = config.run.seed
    opponents = FixedGroups.for_runner(config.env.opponents, env.groups, seed, index)
    acting = CTEDDActing(actor, exploration_scale(config, actor), group.name, opponents)
    return MultiAgentRunner(env, acting, config.rollout_steps, derive_seed(seed, "env", index))
