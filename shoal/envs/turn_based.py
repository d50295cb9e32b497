"""PettingZoo's turn-based (AEC) envs behind the parallel API, one move per step.

`shoal.envs.pettingzoo.PettingZooVectorEnv` steps parallel envs; a board game (PettingZoo's
classic envs) goes through `TurnBasedParallel`, which applies only the move of the player
whose turn it is and tells the vector env who that was (``last_actor``): that player is
active, the others wait (see the module doc of `shoal.envs.pettingzoo`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym


class TurnBasedParallel:
    """A PettingZoo AEC (turn-based) env behind the parallel API that `PettingZooVectorEnv`
    steps: ``step`` takes an action for every live agent, applies the one of the agent whose
    turn it is (``last_actor`` afterwards), and returns every agent's observation, the reward
    each received from that move, and the terminations and truncations."""

    def __init__(self, env: Any):
        self.env = env
        self.possible_agents = list(env.possible_agents)
        self.metadata = getattr(env, "metadata", {})
        self.last_actor: str | None = None
        self._over = False

    @property
    def agents(self) -> list[str]:
        return [] if self._over else list(self.env.agents)

    @property
    def unwrapped(self) -> TurnBasedParallel:
        return self

    def observation_space(self, agent: str) -> gym.Space:
        return self.env.observation_space(agent)

    def action_space(self, agent: str) -> gym.Space:
        return self.env.action_space(agent)

    def _observe_all(self) -> dict[str, Any]:
        return {agent: self.env.observe(agent) for agent in self.env.agents}

    def reset(self, seed: int | None = None, options: Any = None) -> tuple[dict, dict]:
        self.env.reset(seed=seed, options=options)
        self.last_actor = None
        self._over = False
        return self._observe_all(), {agent: {} for agent in self.env.agents}

    def step(self, actions: Mapping[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        env = self.env
        actor = env.agent_selection
        self.last_actor = actor
        env.step(actions[actor])
        agents = list(env.agents)
        obs = self._observe_all()
        rewards = {agent: float(env.rewards.get(agent, 0.0)) for agent in agents}
        terms = {agent: bool(env.terminations.get(agent, False)) for agent in agents}
        truncs = {agent: bool(env.truncations.get(agent, False)) for agent in agents}
        if agents and all(terms[a] or truncs[a] for a in agents):
            # The game is over for everyone: PettingZoo would have each player step once
            # more with None to leave; the vector env resets the game instead.
            self._over = True
        return obs, rewards, terms, truncs, {agent: {} for agent in agents}

    def render(self) -> Any:
        return self.env.render()

    def close(self) -> None:
        self.env.close()
