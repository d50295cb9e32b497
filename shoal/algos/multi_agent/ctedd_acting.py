"""CTEDD's acting parts (Chen 2019, `shoal.algos.multi_agent.ctedd`): the global policies'
CPU copies that drive the `MultiAgentRunner` while the learner trains on its own device, and a
team's policies as the shared evaluation (`shoal.collect.evaluate.evaluate_joint`) plays them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from shoal.collect.multi_agent import JointObs
from shoal.core.errors import ShoalError
from shoal.envs.multi_agent import MultiAgentStep
from shoal.fast.backend import uncompiled_copy
from shoal.nn.local_policies import ExplorationScale, GlobalActor


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

    def set_weights(self, actor: GlobalActor, scale: ExplorationScale) -> None:
        """The learner's current global policies (and its random-action switch)."""
        with torch.no_grad():
            for copy, source in ((self.actor, actor), (self.scale, scale)):
                own, theirs = copy.state_dict(keep_vars=True), source.state_dict(keep_vars=True)
                torch._foreach_copy_(list(own.values()), [theirs[k].detach() for k in own])

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
