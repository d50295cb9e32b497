"""Several policies over the agents of one multi-agent env, deployed together.

`PolicySet` holds each learned policy's network with the rows it reads (`AgentRows`) and
the agents it acts for (`shoal.envs.policy_map`), and the fixed policies of the other
groups; ``act_joint({group: obs})`` returns every group's actions, each agent acting on its
own observation (decentralized execution). The critic-only part of a MAPPO row (the global
state) is filled with zeros when no state is given: the policy never reads it.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from shoal.envs.agents_as_batch import AgentRows
from shoal.envs.multi_agent import AgentGroup
from shoal.envs.policy_map import PolicyAgents, empty_actions
from shoal.envs.shapes import shape_of


class PolicySet(nn.Module):
    def __init__(
        self,
        groups: Mapping[str, AgentGroup],
        policies: Mapping[str, PolicyAgents],
        rows: Mapping[str, AgentRows],
        models: Mapping[str, nn.Module],
        opponents: Mapping[str, Any],
        state_dim: int = 0,
    ):
        super().__init__()
        self.groups = dict(groups)
        self.policies, self.rows = dict(policies), dict(rows)
        self.models = nn.ModuleDict(dict(models))
        self.opponents = dict(opponents)
        self.state_dim = state_dim
        self._takes_mask = {name: takes_mask(m) for name, m in self.models.items()}

    @torch.inference_mode()
    def act_joint(
        self,
        obs: Mapping[str, torch.Tensor],
        deterministic: bool = False,
        state: torch.Tensor | None = None,
        action_mask: Mapping[str, torch.Tensor] | None = None,
    ) -> dict[str, torch.Tensor]:
        arrays = {g: np.asarray(o) for g, o in obs.items()}
        batch = next(iter(arrays.values())).shape[0]
        if state is None:
            global_state = np.zeros((batch, self.state_dim), np.float32)
        else:
            global_state = np.asarray(state, np.float32)
        masks = None if action_mask is None else {g: np.asarray(m) for g, m in action_mask.items()}
        actions = empty_actions(self.groups, batch)
        for name, policy in self.policies.items():
            rows = torch.as_tensor(self.rows[name].rows(policy.gather(arrays), global_state))
            model: Any = self.models[name]  # any model with distribution(obs[, mask])
            if masks is not None and self._takes_mask[name]:
                legal = torch.as_tensor(policy.gather(masks).reshape(rows.shape[0], -1))
                dist = model.distribution(rows, legal)
            else:
                dist = model.distribution(rows)
            chosen = (dist.mode() if deterministic else dist.sample()).numpy()
            shape = shape_of(policy.action_space)
            policy.scatter(chosen.reshape(batch, policy.size, *shape), actions)
        for group, opponent in self.opponents.items():
            legal_rows = None if masks is None else masks[group]
            actions[group] = opponent.act(arrays[group], legal_rows)
        return {g: torch.as_tensor(a) for g, a in actions.items()}


def takes_mask(model: Any) -> bool:
    """Whether ``model.distribution`` takes legal-action masks (``action_mask``)."""
    return "action_mask" in inspect.signature(model.distribution).parameters
