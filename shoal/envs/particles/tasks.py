"""The tasks of `shoal.envs.particles`: MPE's cooperative navigation and the four benchmarks of
Chen 2019 ("A New Framework for Multi-Agent Reinforcement Learning", section 5.1), each a
`ParticleEnv` with its own observations and reward rules, registered under their ids (the table
in the package docstring)."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from shoal.core.errors import ConfigError
from shoal.envs.batched import factory
from shoal.envs.multi_agent import (
    AgentGroup,
    EpisodeTracker,
    MultiAgentStep,
    register_multi_agent_env,
)
from shoal.envs.particles.world import DIRECTIONS, F32, ParticleEnv

if TYPE_CHECKING:
    pass


class SpreadEnv(ParticleEnv):
    """``shoal/spread-v0``: MPE's cooperative navigation (mpe2 ``simple_spread_v3``).

    N agents (default 3) must cover N landmarks (``num_landmarks`` may differ). Observation
    ``[own vel (2), own pos (2), landmark pos - own pos (2L), other agent pos - own pos
    (2(N-1)), other agents' messages ((N-1) * message_dim)]`` (14 numbers for 3 agents
    without messages; mpe2 adds 4 always-zero communication numbers of its silent agents).

    Reward, exactly mpe2's ``local_ratio`` semantics: the global reward is ``G = -sum over
    landmarks of the distance to the closest agent``, the local reward of agent ``i`` is
    ``-1`` per other agent it overlaps, and ``r_i = (1 - local_ratio) * G + local_ratio *
    local_i``; ``local_ratio = 0.5`` by default, as mpe2. 25 steps, never terminated.
    """

    env_id = "shoal/spread-v0"
    distance_observations = False

    def __init__(self, num_envs: int = 1, *, local_ratio: float = 0.5, **kwargs: Any):
        if not 0.0 <= local_ratio <= 1.0:
            raise ConfigError(f"local_ratio = {local_ratio} is invalid: must be in [0, 1]")
        self.local_ratio = float(local_ratio)
        num_agents = kwargs.get("num_agents")
        if kwargs.get("num_landmarks") is None and num_agents is not None:
            kwargs["num_landmarks"] = num_agents
        super().__init__(num_envs, **kwargs)

    def _rules(self, old_pos: np.ndarray) -> np.ndarray:
        reward = self.collisions().astype(F32)
        reward *= F32(-self.local_ratio * self.collision_penalty)
        reward += F32(1.0 - self.local_ratio) * -self.landmark_cover()[:, None]
        return reward


class CooperativeNavigationV1Env(ParticleEnv):
    """``shoal/cn-v1-v0``: Chen's Cooperative Navigation V1.

    3 agents, 3 static landmarks, 25 steps. Observation: Euclidean distances to the other
    agents (N-1, agent order) and to every landmark (L), then the other agents' messages: no
    positions, no velocities. Reward of agent ``i``: ``-sum over landmarks of the distance to
    the closest agent`` (shared) ``- 1.0`` per other agent overlapping agent ``i``
    (collisions penalize every agent involved).
    """

    env_id = "shoal/cn-v1-v0"

    def _rules(self, old_pos: np.ndarray) -> np.ndarray:
        return self._team_reward()


class CooperativeNavigationV2Env(ParticleEnv):
    """``shoal/cn-v2-v0``: Chen's Cooperative Navigation V2.

    3 agents, 2 static landmarks, 25 steps, observations and collision penalty as CN-V1.
    Every agent *belongs* to the landmark it is closer to (ties: the first). The *primary*
    landmark is the one closer to its closest agent (``argmin_l min_i d(i, l)``, ties: the
    first); it must get two agents and the other landmark one. When two (or more) agents
    belong to the non-primary landmark, every agent gets ``wrong_split_penalty`` (-10.0).
    Three agents at the primary landmark are not penalized by this rule (the distance term
    already is). Reward: CN-V1's plus that penalty.
    """

    env_id = "shoal/cn-v2-v0"
    default_landmarks = 2
    wrong_split_penalty = -10.0
    options = ("collision_penalty", "wrong_split_penalty")

    def __init__(self, num_envs: int = 1, **kwargs: Any):
        super().__init__(num_envs, **kwargs)
        if self.num_agents != 3 or self.num_landmarks != 2:
            raise ConfigError(f"{self.env_id} is defined for 3 agents and 2 landmarks")

    def wrong_split(self) -> np.ndarray:
        """``[B]`` bool: the paper's -10 case."""
        d = self._ldist  # [B, N, 2]
        primary = np.argmin(d.min(axis=1), axis=1)  # [B]
        nearest = np.argmin(d, axis=2)  # [B, N]
        at_secondary = (nearest != primary[:, None]).sum(axis=1)
        return at_secondary >= 2

    def _rules(self, old_pos: np.ndarray) -> np.ndarray:
        reward = self._team_reward()
        reward += (F32(self.wrong_split_penalty) * self.wrong_split())[:, None]
        return reward


class PushForwardEnv(ParticleEnv):
    """``shoal/push-forward-v0``: Chen's Push Forward.

    3 agents, 3 movable landmarks, 50 steps; observations as CN-V1 (distances and messages).
    A landmark's *push zone* is the disk of radius ``push_radius`` (0.25: touching distance
    agent size + landmark size = 0.2, plus a 0.05 margin) around it. A *push* happens in an
    env when, at the start of the step, every agent is in the push zone of a different
    landmark (some assignment of agents to distinct landmarks puts each agent in its
    landmark's zone) and every agent ends the step to the right of where it started
    (``x_new > x_old``). Then every landmark moves right by ``push_distance`` (0.05) and
    every agent gets ``push_reward`` (+10.0). Reward of agent ``i``: ``-sum over landmarks
    of the distance to the closest agent`` (after the push) ``- 1.0`` per other agent
    overlapping ``i`` ``+ 10.0`` on push steps. Landmarks do not collide; their velocity in
    the state is ``push_distance / dt`` on push steps, else 0.
    """

    env_id = "shoal/push-forward-v0"
    default_steps = 50
    push_radius = 0.25
    push_distance = 0.05
    push_reward = 10.0
    options = ("collision_penalty", "push_radius", "push_distance", "push_reward")

    def __init__(self, num_envs: int = 1, **kwargs: Any):
        super().__init__(num_envs, **kwargs)
        if self.num_landmarks < self.num_agents:
            raise ConfigError(f"{self.env_id} needs at least as many landmarks as agents")
        self._assignments = np.array(
            list(itertools.permutations(range(self.num_landmarks), self.num_agents)), np.intp
        )

    def pushing(self, old_pos: np.ndarray) -> np.ndarray:
        """``[B]`` bool: the push condition for agents that moved from ``old_pos``."""
        rel = old_pos[:, :, None, :] - self.landmark_pos[:, None, :, :]
        in_zone = np.einsum("bilk,bilk->bil", rel, rel) <= F32(self.push_radius**2)
        matched = in_zone[:, np.arange(self.num_agents), self._assignments]  # [B, P, N]
        all_in = matched.all(axis=2).any(axis=1)
        return all_in & (self.agent_pos[:, :, 0] > old_pos[:, :, 0]).all(axis=1)

    def _rules(self, old_pos: np.ndarray) -> np.ndarray:
        push = self.pushing(old_pos)
        self.landmark_vel[:] = 0.0
        if push.any():
            self.landmark_pos[push, :, 0] += F32(self.push_distance)
            self.landmark_vel[push, :, 0] = F32(self.push_distance / self.dt)
            self.refresh()
        reward = self._team_reward()
        reward += (F32(self.push_reward) * push)[:, None]
        return reward

    def _render_circles(self) -> list[tuple[float, float, float, tuple[int, int, int]]]:
        zones = [
            (float(x), float(y), self.push_radius, (200, 235, 200)) for x, y in self.landmark_pos[0]
        ]
        return zones + super()._render_circles()


class PredatorPreyEnv(ParticleEnv):
    """``shoal/predator-prey-v0``: Chen's Predator and Prey.

    3 predators (the agents) and 2 preys (movable landmarks), 50 steps (the paper gives 50
    for PF and PP); observations as CN-V1 (distances to the other agents and the preys,
    messages). Preys move by a fixed rule with global knowledge, after the agents' physics
    step: they know the agents' next positions exactly (position, velocity and acceleration,
    contact forces included: perfect prediction) and each prey moves by ``prey_step`` (0.1;
    agents reach 0.2 per step at full speed) along the one of ``prey_directions`` (16)
    evenly spaced directions that maximizes the sum of its distances to the agents; preys
    stay inside the arena ``[-arena, arena]^2`` (1.5; candidate moves are clipped to it
    before they are compared). A prey is *captured* when every agent is within
    ``capture_radius`` (0.3, which three non-overlapping agents can reach) of it after the
    move: every agent then gets ``capture_reward`` (+10.0) per captured prey, and the prey
    respawns uniformly in ``[-1, 1]^2`` (after the reward is computed). Reward of agent
    ``i``: ``-sum over preys of the distance to the closest agent - 1.0`` per other agent
    overlapping ``i`` ``+ 10.0`` per capture. Preys do not collide.

    ``prey="learned"``: the preys are a second agent group, ``prey`` (``prey_0 ..``), that
    learns instead of following the rule. A prey moves ``prey_step`` per step in the
    direction it picks (``Discrete(5)``: no-op, -x, +x, -y, +y; or with ``continuous`` a
    ``Box(-1, 1, (2,))`` direction, its length capped at 1), inside the arena; it observes its
    position and its distances to the predators and to the other preys, and gets the distance
    to its closest predator each step, ``-capture_reward`` when captured.
    """

    env_id = "shoal/predator-prey-v0"
    default_landmarks = 2
    default_steps = 50
    capture_radius = 0.3
    capture_reward = 10.0
    prey_step = 0.1
    prey_directions = 16
    arena = 1.5
    options = (
        "collision_penalty",
        "capture_radius",
        "capture_reward",
        "prey_step",
        "prey_directions",
        "arena",
    )

    def __init__(self, num_envs: int = 1, *, prey: str = "rule", **kwargs: Any):
        super().__init__(num_envs, **kwargs)
        if prey not in ("rule", "learned"):
            raise ConfigError(f"{self.env_id}: prey must be 'rule' or 'learned', not {prey!r}")
        angles = np.arange(self.prey_directions) * (2 * np.pi / self.prey_directions)
        self._moves = (np.stack([np.cos(angles), np.sin(angles)], 1) * self.prey_step).astype(F32)
        self.learned_prey = prey == "learned"
        self._prey_actions: np.ndarray | None = None
        self._caught = np.zeros((self.num_envs, self.num_landmarks), bool)
        if self.learned_prey:
            n, m = self.num_agents, self.num_landmarks
            action: gym.Space = (
                gym.spaces.Box(-1.0, 1.0, (2,), F32) if self.continuous else gym.spaces.Discrete(5)
            )
            obs = gym.spaces.Box(-np.inf, np.inf, (2 + n + m - 1,), F32)
            agents = tuple(f"prey_{i}" for i in range(m))
            self.groups["prey"] = AgentGroup("prey", agents, obs, action)
            self.tracker = EpisodeTracker(self.num_envs, self.groups)
            self._other_preys = np.array(
                [[j for j in range(m) if j != i] for i in range(m)], np.intp
            )

    def step(self, actions: dict[str, np.ndarray]) -> MultiAgentStep:
        if self.learned_prey:
            self._prey_actions = np.asarray(actions["prey"])
        return super().step(actions)

    def reset(self, seed: int | None = None) -> tuple[dict[str, np.ndarray], np.ndarray]:
        self._caught[:] = False
        return super().reset(seed)

    def steer(self) -> None:
        """Move every learned prey ``prey_step`` along the direction it chose."""
        prey, a = self.landmark_pos, self._prey_actions
        assert a is not None, "steer() runs after step() has stored the prey's actions"
        if self.continuous:
            direction = np.clip(a.reshape(self.num_envs, -1, 2), -1.0, 1.0).astype(F32)
            norm = np.sqrt((direction * direction).sum(-1, keepdims=True))
            direction = direction / np.maximum(norm, F32(1.0))
        else:
            direction = DIRECTIONS[a.reshape(self.num_envs, -1).astype(np.intp)]
        new = np.clip(prey + direction * F32(self.prey_step), -self.arena, self.arena)
        np.subtract(new, prey, out=self.landmark_vel)
        self.landmark_vel *= F32(1.0 / self.dt)
        prey[:] = new

    def evade(self) -> None:
        """Move every prey (see the class doc) given the agents' current positions."""
        prey, agents = self.landmark_pos, self.agent_pos
        cand = prey[:, :, None, :] + self._moves  # [B, L, K, 2]
        np.clip(cand, -self.arena, self.arena, out=cand)
        rel = cand[:, :, :, None, :] - agents[:, None, None, :, :]  # [B, L, K, N, 2]
        total = np.sqrt(np.einsum("blknd,blknd->blkn", rel, rel)).sum(axis=3)
        best = np.argmax(total, axis=2)  # [B, L]
        new = np.take_along_axis(cand, best[:, :, None, None], axis=2)[:, :, 0]
        np.subtract(new, prey, out=self.landmark_vel)
        self.landmark_vel *= F32(1.0 / self.dt)
        prey[:] = new

    def captured(self) -> np.ndarray:
        """``[B, L]`` bool: every agent within the capture radius of the prey."""
        return (self._ldist <= F32(self.capture_radius)).all(axis=1)

    def _rules(self, old_pos: np.ndarray) -> np.ndarray:
        if self.learned_prey:
            self.steer()
        else:
            self.evade()
        self.refresh()
        caught = self.captured()
        self._caught = caught
        self._prey_reward = self._ldist.min(axis=1) - F32(self.capture_reward) * caught
        reward = self._team_reward()
        reward += (F32(self.capture_reward) * caught.sum(axis=1, dtype=F32))[:, None]
        if caught.any():
            self.landmark_pos[caught] = self.rng.uniform(-1.0, 1.0, (int(caught.sum()), 2))
            self.landmark_vel[caught] = 0.0
            self.refresh()
        return reward

    def _other_rewards(self) -> dict[str, np.ndarray]:
        if not self.learned_prey:
            return {}
        return {"prey": self._prey_reward.astype(F32)}

    def _other_observations(self) -> dict[str, np.ndarray]:
        if not self.learned_prey:
            return {}
        prey = self.landmark_pos
        gap = prey[:, :, None, :] - prey[:, None, :, :]
        prey_dist = np.sqrt((gap * gap).sum(-1))[:, np.arange(self.num_landmarks)[:, None],
                                                  self._other_preys]  # fmt: skip
        to_predators = self._ldist.transpose(0, 2, 1)  # [B, L, N]
        return {"prey": np.concatenate([prey, to_predators, prey_dist], axis=2).astype(F32)}

    def _render_circles(self) -> list[tuple[float, float, float, tuple[int, int, int]]]:
        circles = super()._render_circles()
        m = self.num_landmarks
        return [(x, y, r, (217, 64, 64)) for x, y, r, _ in circles[:m]] + circles[m:]


ENVS: dict[str, type[ParticleEnv]] = {
    cls.env_id: cls
    for cls in (
        SpreadEnv,
        CooperativeNavigationV1Env,
        CooperativeNavigationV2Env,
        PushForwardEnv,
        PredatorPreyEnv,
    )
}


for _id, _cls in ENVS.items():
    register_multi_agent_env(_id, factory(_cls))
