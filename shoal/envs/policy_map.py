"""Which policy acts for which agent in a multi-agent run.

Users of multi-agent libraries map agents to policies freely (RLlib's ``policy_mapping_fn``,
BenchMARL's groups). A shoal run maps them with three settings of `shoal.config.EnvConfig`:

* by default one shared policy per agent group, named after the group;
* ``policy_per_agent``: one policy per agent, named after the agent;
* ``policy_map``: ``{group or agent id: policy name}``; an agent id overrides its group's
  entry, and every agent of a learning group must be mapped.

Groups with a fixed policy (``env.opponents``) get no learned policy. Agents that share a
policy must have the same observation and action spaces: their rows are one batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from shoal.core.errors import ConfigError
from shoal.envs.multi_agent import AgentGroup
from shoal.envs.shapes import shape_of


@dataclass(frozen=True)
class PolicyAgents:
    """The agents one policy acts for, in order: groups in the env's order, agents in their
    group's order. ``parts`` lists ``(group, agent indices in the group)``."""

    name: str
    parts: tuple[tuple[str, tuple[int, ...]], ...]
    agents: tuple[str, ...]
    observation_space: gym.Space
    action_space: gym.Space

    @property
    def size(self) -> int:
        return len(self.agents)

    def gather(self, arrays: Mapping[str, np.ndarray]) -> np.ndarray:
        """``{group: [B, N_g, ...]}`` -> this policy's agents ``[B, N_p, ...]``."""
        pieces = [np.asarray(arrays[g])[:, list(idx)] for g, idx in self.parts]
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces, axis=1)

    def scatter(self, values: np.ndarray, out: dict[str, np.ndarray]) -> None:
        """Write this policy's ``[B, N_p, ...]`` values into ``out``'s group arrays."""
        start = 0
        for g, idx in self.parts:
            out[g][:, list(idx)] = values[:, start : start + len(idx)]
            start += len(idx)


def resolve_policies(
    groups: Mapping[str, AgentGroup],
    policy_map: Mapping[str, str] | None = None,
    per_agent: bool = False,
    opponents: Mapping[str, str] | None = None,
) -> dict[str, PolicyAgents]:
    """The learned policies of a run and their agents (see the module doc); a clear error
    for a map that names an unknown group or agent, maps an agent of a fixed-policy group,
    or puts agents with different spaces under one policy."""
    policy_map = dict(policy_map or {})
    opponents = dict(opponents or {})
    agent_group = {agent: g.name for g in groups.values() for agent in g.agents}
    unknown = [key for key in policy_map if key not in groups and key not in agent_group]
    if unknown:
        raise ConfigError(
            f"env.policy_map names {unknown}, which are neither groups {list(groups)} nor "
            f"agents {list(agent_group)} of this env"
        )
    fixed = [k for k in policy_map if k in opponents or agent_group.get(k) in opponents]
    if fixed:
        raise ConfigError(
            f"env.policy_map maps {fixed}, whose groups act by env.opponents; map only the "
            "learning groups"
        )
    chosen: dict[str, list[tuple[str, int, str]]] = {}
    unmapped = []
    for group in groups.values():
        if group.name in opponents:
            continue
        for index, agent in enumerate(group.agents):
            name = policy_map.get(agent, policy_map.get(group.name))
            if name is None and policy_map:
                unmapped.append(agent)
            name = name or (agent if per_agent else group.name)
            chosen.setdefault(name, []).append((group.name, index, agent))
    if unmapped:
        raise ConfigError(
            f"env.policy_map leaves agents {unmapped} without a policy: map them (or their "
            "groups) to a policy, or give their groups a fixed one with env.opponents"
        )
    if not chosen:
        raise ConfigError("every agent group acts by env.opponents: nothing is left to train")
    policies = {}
    for name, members in chosen.items():
        first = groups[members[0][0]]
        odd = sorted(
            {
                g
                for g, _, _ in members
                if groups[g].observation_space != first.observation_space
                or groups[g].action_space != first.action_space
            }
        )
        if odd:
            raise ConfigError(
                f"policy {name!r} would act for agents of groups {[first.name, *odd]} whose "
                "observation or action spaces differ; agents that share a policy need the "
                "same spaces: map them to separate policies in env.policy_map"
            )
        parts: dict[str, list[int]] = {}
        for g, index, _ in members:
            parts.setdefault(g, []).append(index)
        policies[name] = PolicyAgents(
            name,
            tuple((g, tuple(idx)) for g, idx in parts.items()),
            tuple(agent for _, _, agent in members),
            first.observation_space,
            first.action_space,
        )
    return policies


def empty_actions(groups: Mapping[str, AgentGroup], num_envs: int) -> dict[str, np.ndarray]:
    """Zeroed action arrays ``[B, N_g, ...]`` of every group, in each group's dtype."""
    return {
        name: np.zeros((num_envs, g.size, *shape_of(g.action_space)), g.action_space.dtype)
        for name, g in groups.items()
    }
