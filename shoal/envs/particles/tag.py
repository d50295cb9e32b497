"""``shoal/tag-v0``: predator-prey tag (MPE's ``simple_tag``, Lowe et al. 2017) vectorized,
with both sides learning: two agent groups in one batched world.

Three slower, larger predators (group ``adversary``: size 0.075, acceleration 3.0, top speed
1.0) chase one faster prey (group ``agent``: size 0.05, acceleration 4.0, top speed 1.3)
among two static obstacles (size 0.2), as in MPE. Every entity collides through MPE's soft
contact force (`shoal.envs.particles`); obstacles do not move. Episodes last 25 steps
(truncated).

Rewards, per step:

* every predator gets +10 for each (predator, prey) pair in contact (shared by the team);
* a prey gets -10 for each predator touching it, and minus ``bound(|x|) + bound(|y|)`` for
  straying off the arena: ``bound(v)`` is 0 below 0.9, ``10 (v - 0.9)`` below 1, and
  ``min(exp(2 v - 2), 10)`` beyond.

Observations (MPE's layout): own velocity and position, the obstacles' positions relative
to the agent, every other agent's relative position (agent order: predators, then preys),
then the velocities of the preys other than itself. Predators: 16 numbers, the prey: 14
(with the default sizes). Actions: ``Discrete(5)`` (no-op, -x, +x, -y, +y; MPE's order) or,
with ``continuous=True``, ``Box(-1, 1, (2,))`` forces. Global state: every agent's position
and velocity, then the obstacles' positions. Initial agent positions are uniform in
``[-1, 1]^2``, obstacles in ``[-0.9, 0.9]^2``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import gymnasium as gym
import numpy as np

from shoal.core.errors import ConfigError
from shoal.envs.batched import BatchedWorld, disc_frame, factory
from shoal.envs.multi_agent import (
    AgentGroup,
    EpisodeTracker,
    MultiAgentStep,
    register_multi_agent_env,
)
from shoal.envs.particles.world import DIRECTIONS, F32

PREDATORS, PREY = "adversary", "agent"


def bound(v: np.ndarray) -> np.ndarray:
    """MPE's penalty for a coordinate of magnitude ``v`` near or past the arena's edge."""
    return np.where(
        v < 0.9, 0.0, np.where(v < 1.0, (v - 0.9) * 10.0, np.minimum(np.exp(2 * v - 2), 10.0))
    ).astype(F32)


class TagEnv(BatchedWorld):
    env_id: str = "shoal/tag-v0"
    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["rgb_array"], "render_fps": 10}
    dt, damping, contact_force, contact_margin = 0.1, 0.25, 1e2, 1e-3
    sizes = {PREDATORS: 0.075, PREY: 0.05}
    accel = {PREDATORS: 3.0, PREY: 4.0}
    max_speed = {PREDATORS: 1.0, PREY: 1.3}
    obstacle_size = 0.2
    tag_reward = 10.0
    state_arrays = ("pos", "vel", "t")

    def __init__(
        self,
        num_envs: int = 1,
        *,
        num_predators: int = 3,
        num_prey: int = 1,
        num_obstacles: int = 2,
        continuous: bool = False,
        max_episode_steps: int | None = None,
        seed: int | None = None,
    ):
        if num_envs < 1 or num_predators < 1 or num_prey < 1 or num_obstacles < 0:
            raise ConfigError(
                f"{self.env_id}: needs num_envs, num_predators and num_prey >= 1 and "
                f"num_obstacles >= 0, got {num_envs}, {num_predators}, {num_prey}, "
                f"{num_obstacles}"
            )
        self.num_envs = B = int(num_envs)
        self.counts = {PREDATORS: int(num_predators), PREY: int(num_prey)}
        self.num_agents = n = num_predators + num_prey
        self.num_obstacles = m = int(num_obstacles)
        self.continuous = bool(continuous)
        self.max_episode_steps = int(max_episode_steps or 25)
        is_prey = np.arange(n) >= num_predators
        self.is_prey = is_prey
        self.size = np.where(is_prey, self.sizes[PREY], self.sizes[PREDATORS]).astype(F32)
        self.agent_accel = np.where(is_prey, self.accel[PREY], self.accel[PREDATORS]).astype(F32)
        self.agent_max_speed = np.where(is_prey, self.max_speed[PREY], self.max_speed[PREDATORS])
        sizes = np.concatenate([self.size, np.full(m, self.obstacle_size, F32)])
        self._dist_min = (sizes[:, None] + sizes[None, :]).astype(F32)
        self._not_self = ~np.eye(n + m, dtype=bool)
        self._others = np.array([[j for j in range(n) if j != i] for i in range(n)], np.intp)
        action = gym.spaces.Box(-1.0, 1.0, (2,), F32) if self.continuous else gym.spaces.Discrete(5)
        self.groups: dict[str, AgentGroup] = {}
        for name in (PREDATORS, PREY):
            k = self.counts[name]
            seen_prey = num_prey - (1 if name == PREY else 0)
            dim = 4 + 2 * m + 2 * (n - 1) + 2 * seen_prey
            self.groups[name] = AgentGroup(
                name,
                tuple(f"{name}_{i}" for i in range(k)),
                gym.spaces.Box(-np.inf, np.inf, (dim,), F32),
                action,
            )
        self.state_space = gym.spaces.Box(-np.inf, np.inf, (4 * n + 2 * m,), F32)
        self.pos = np.zeros((B, n + m, 2), F32)
        """Agents (predators, then preys), then obstacles."""
        self.vel = np.zeros((B, n, 2), F32)
        self.t = np.zeros(B, np.int64)
        self._needs_reset = np.zeros(B, bool)
        self._started = False
        self.rng = np.random.default_rng(seed)
        self.tracker = EpisodeTracker(B, self.groups)

    # ----------------------------------------------------------------- protocol

    def step(self, actions: dict[str, np.ndarray]) -> MultiAgentStep:
        if not self._started:
            self.reset()
        n = self.num_agents
        resetting = self._needs_reset
        force = self._action_force(actions) + self.contact_forces()
        vel = self.vel * F32(1.0 - self.damping) + force * F32(self.dt)
        speed = np.sqrt((vel * vel).sum(-1, keepdims=True))
        limit = self.agent_max_speed[None, :, None]
        vel = np.where(speed > limit, vel / np.maximum(speed, 1e-12) * limit, vel).astype(F32)
        self.vel = vel
        self.pos[:, :n] += vel * F32(self.dt)
        self.t += 1
        rewards = self.rewards()
        ended = self.t >= self.max_episode_steps
        if resetting.any():
            index = np.flatnonzero(resetting)
            self._reset_envs(index)
            for r in rewards.values():
                r[index] = 0.0
            ended[index] = False
        self._needs_reset = ended
        counted = ~resetting
        returns, lengths = self.tracker.update(rewards, counted, ended)
        obs, state = self.observe()
        groups = self.groups.items()
        return MultiAgentStep(
            obs=obs,
            rewards=rewards,
            terminated={g: np.zeros((self.num_envs, s.size), bool) for g, s in groups},
            truncated={g: np.repeat(ended[:, None], s.size, 1) for g, s in groups},
            active={g: np.repeat(counted[:, None], s.size, 1) for g, s in groups},
            autoreset=resetting.copy(),
            state=state,
            episode_returns=returns,
            episode_lengths=lengths,
        )

    def render(self) -> np.ndarray:
        """A 250x250 RGB frame of env 0: predators red, preys green, obstacles grey; the
        view covers ``[-1, 1]^2`` and grows to keep every entity in sight."""
        n, pos = self.num_agents, self.pos[0]
        obstacles = [(x, y, self.obstacle_size, (64, 64, 64)) for x, y in pos[n:]]
        agents = [
            (x, y, r, (89, 217, 89) if prey else (217, 89, 89))
            for (x, y), r, prey in zip(pos[:n], self.size, self.is_prey, strict=True)
        ]
        return disc_frame(obstacles + agents, 250)  # agents drawn on top

    # ----------------------------------------------------------------- physics and rules

    def _action_force(self, actions: dict[str, np.ndarray]) -> np.ndarray:
        B = self.num_envs
        parts = []
        for name in (PREDATORS, PREY):
            a = np.asarray(actions[name])
            if self.continuous:
                parts.append(np.clip(a.reshape(B, -1, 2), -1.0, 1.0).astype(F32))
            else:
                parts.append(DIRECTIONS[a.reshape(B, -1).astype(np.intp)])
        return np.concatenate(parts, 1) * self.agent_accel[None, :, None]

    def contact_forces(self) -> np.ndarray:
        """``[B, N, 2]``: MPE's soft contact force on every agent from every other entity."""
        n = self.num_agents
        delta = self.pos[:, :, None, :] - self.pos[:, None, :, :]  # p_a - p_b
        dist = np.sqrt((delta * delta).sum(-1))
        k = self.contact_margin
        penetration = np.logaddexp(0.0, -(dist - self._dist_min) / k) * k
        scale = np.where(self._not_self, penetration / np.maximum(dist, 1e-12), 0.0)
        force = self.contact_force * (scale[..., None] * delta).sum(2)
        return force[:, :n].astype(F32)

    def touching(self) -> np.ndarray:
        """``[B, N, N]`` bool: agents in contact (distance below the sum of their sizes)."""
        n = self.num_agents
        delta = self.pos[:, :n, None, :] - self.pos[:, None, :n, :]
        dist = np.sqrt((delta * delta).sum(-1))
        return (dist < self._dist_min[:n, :n]) & self._not_self[:n, :n]

    def rewards(self) -> dict[str, np.ndarray]:
        p = self.counts[PREDATORS]
        tags = self.touching()[:, :p, p:]  # [B, predators, preys]
        predators = np.repeat((self.tag_reward * tags.sum((1, 2)))[:, None], p, 1).astype(F32)
        prey_pos = self.pos[:, p : self.num_agents]
        prey = -self.tag_reward * tags.sum(1) - bound(np.abs(prey_pos)).sum(-1)
        return {PREDATORS: predators, PREY: prey.astype(F32)}

    def observe(self) -> tuple[dict[str, np.ndarray], np.ndarray]:
        B, n, p = self.num_envs, self.num_agents, self.counts[PREDATORS]
        agents = self.pos[:, :n]
        own = [self.vel, agents]
        obstacles = (self.pos[:, None, n:] - agents[:, :, None]).reshape(B, n, -1)
        others = (agents[:, self._others] - agents[:, :, None]).reshape(B, n, -1)
        prey_vel = self.vel[:, p:]
        obs = {}
        for name, rows in ((PREDATORS, range(p)), (PREY, range(p, n))):
            parts = []
            for i in rows:
                seen = [j for j in range(self.counts[PREY]) if j + p != i]
                parts.append(
                    np.concatenate(
                        [
                            own[0][:, i],
                            own[1][:, i],
                            obstacles[:, i],
                            others[:, i],
                            prey_vel[:, seen].reshape(B, -1),
                        ],
                        axis=-1,
                    )  # fmt: skip
                )
            obs[name] = np.stack(parts, 1).astype(F32)
        state = np.concatenate(
            [agents.reshape(B, -1), self.vel.reshape(B, -1), self.pos[:, n:].reshape(B, -1)], 1
        ).astype(F32)
        return obs, state

    def _reset_envs(self, index: np.ndarray) -> None:
        k, n, m = len(index), self.num_agents, self.num_obstacles
        self.pos[index, :n] = self.rng.uniform(-1.0, 1.0, (k, n, 2))
        self.pos[index, n:] = self.rng.uniform(-0.9, 0.9, (k, m, 2))
        self.vel[index] = 0.0
        self.t[index] = 0


register_multi_agent_env(TagEnv.env_id, factory(TagEnv))
