"""The particle world shared by every task of `shoal.envs.particles`: the batched physics,
observations, episode bookkeeping, state and rendering (`ParticleEnv`). The package docstring
describes the physics and the action and state layouts; the tasks are in
`shoal.envs.particles.tasks`."""

from __future__ import annotations

from typing import Any, ClassVar

import gymnasium as gym
import numpy as np

from shoal.core.errors import ConfigError
from shoal.envs.batched import BatchedWorld, disc_frame
from shoal.envs.multi_agent import AgentGroup, EpisodeTracker, MultiAgentStep

GROUP = "agent"
F32 = np.float32

# Discrete action -> unit direction, MPE order: no-op, left, right, down, up.
DIRECTIONS = np.array([[0, 0], [-1, 0], [1, 0], [0, -1], [0, 1]], F32)


class ParticleEnv(BatchedWorld):
    """Base particle world: physics, spaces, episodes, autoreset, snapshots and rendering.

    Subclasses set the defaults and implement `_rules` (landmark motion and rewards) and
    `_observations`.
    """

    env_id: str = ""
    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["rgb_array"], "render_fps": 10}
    """Rendering: RGB frames, played at 10 per second (as the multi-agent particle envs)."""
    default_agents: ClassVar[int] = 3
    default_landmarks: ClassVar[int] = 3
    default_steps: ClassVar[int] = 25
    distance_observations: ClassVar[bool] = True
    """Observations are distances to the other agents and landmarks (the paper's tasks);
    False: MPE's velocity, position and relative positions (spread)."""

    dt = 0.1
    damping = 0.25
    mass = 1.0
    accel = 5.0
    contact_force = 1e2
    contact_margin = 1e-3
    agent_size = 0.15
    landmark_size = 0.05
    collision_penalty = 1.0
    """Subtracted from an agent's reward for every other agent it overlaps."""
    options: ClassVar[tuple[str, ...]] = ("collision_penalty",)
    """Task constants a config may override through ``env.kwargs``."""
    state_arrays = ("agent_pos", "agent_vel", "landmark_pos", "landmark_vel", "messages", "t")

    def __init__(
        self,
        num_envs: int = 1,
        *,
        num_agents: int | None = None,
        num_landmarks: int | None = None,
        continuous: bool = False,
        message_dim: int = 0,
        max_episode_steps: int | None = None,
        seed: int | None = None,
        **options: float,
    ):
        for name, value in options.items():
            if name not in self.options:
                raise ConfigError(
                    f"{self.env_id} has no option {name!r}; options: num_agents, "
                    f"num_landmarks, continuous, message_dim, {', '.join(self.options)}"
                )
            setattr(self, name, type(getattr(self, name))(value))
        n = self.default_agents if num_agents is None else int(num_agents)
        m = self.default_landmarks if num_landmarks is None else int(num_landmarks)
        if num_envs < 1:
            raise ConfigError(f"num_envs = {num_envs} is invalid: must be >= 1")
        if n < 2 or m < 1:
            raise ConfigError(f"{self.env_id}: needs >= 2 agents and >= 1 landmark, got {n}, {m}")
        if message_dim < 0:
            raise ConfigError(f"message_dim = {message_dim} is invalid: must be >= 0")
        if message_dim and not continuous:
            raise ConfigError(
                f"message_dim = {message_dim} needs continuous actions: set continuous: true"
            )
        self.num_envs = B = int(num_envs)
        self.num_agents, self.num_landmarks = n, m
        self.continuous = bool(continuous)
        self.message_dim = M = int(message_dim)
        self.max_episode_steps = int(max_episode_steps or self.default_steps)
        self.agent_ids = tuple(f"agent_{i}" for i in range(n))

        if self.distance_observations:
            obs_dim = (n - 1) + m + (n - 1) * M
        else:
            obs_dim = 4 + 2 * m + 2 * (n - 1) + (n - 1) * M
        self.obs_dim = obs_dim
        obs_space = gym.spaces.Box(-np.inf, np.inf, (obs_dim,), F32)
        if self.continuous:
            act_space: gym.Space = gym.spaces.Box(-1.0, 1.0, (2 + M,), F32)
        else:
            act_space = gym.spaces.Discrete(5)
        self.groups = {GROUP: AgentGroup(GROUP, self.agent_ids, obs_space, act_space)}
        self.state_dim = 4 * n + 4 * m + n * M
        self.state_space: gym.Space | None = gym.spaces.Box(-np.inf, np.inf, (self.state_dim,), F32)

        # World state (public: tests and demos may write it, then call refresh()).
        self.agent_pos = np.zeros((B, n, 2), F32)
        self.agent_vel = np.zeros((B, n, 2), F32)
        self.landmark_pos = np.zeros((B, m, 2), F32)
        self.landmark_vel = np.zeros((B, m, 2), F32)
        self.messages = np.zeros((B, n, M), F32)
        self.t = np.zeros(B, np.int64)
        self._needs_reset = np.zeros(B, bool)
        self.rng = np.random.default_rng(seed)
        self.tracker = EpisodeTracker(B, self.groups)

        # Geometry caches, kept in sync with the positions by `refresh`.
        self._delta = np.zeros((B, n, n, 2), F32)  # p_i - p_j
        self._dist = np.zeros((B, n, n), F32)
        self._lrel = np.zeros((B, n, m, 2), F32)  # landmark_l - p_i
        self._ldist = np.zeros((B, n, m), F32)
        self._coef = np.zeros((B, n, n), F32)
        self._others = np.array([[j for j in range(n) if j != i] for i in range(n)], np.intp)
        self._rows = np.arange(n)[:, None]
        self._not_self = ~np.eye(n, dtype=bool)
        self._table = DIRECTIONS * F32(self.accel)
        self._started = False

    # ----------------------------------------------------------------- protocol

    def step(self, actions: dict[str, np.ndarray]) -> MultiAgentStep:
        if not self._started:
            self.reset()
        resetting = self._needs_reset
        force, message = self._decode(actions[GROUP])
        old_pos = self.agent_pos.copy()

        # Soft contact forces between agents (MPE's softplus penetration).
        c = self._coef
        np.subtract(self._dist, F32(2 * self.agent_size), out=c)
        c *= F32(-1.0 / self.contact_margin)
        np.logaddexp(F32(0.0), c, out=c)
        c *= F32(self.contact_force * self.contact_margin)
        c /= np.maximum(self._dist, F32(1e-12))  # the diagonal has delta = 0: no self force
        force += np.einsum("bij,bijk->bik", c, self._delta)

        vel = self.agent_vel
        vel *= F32(1.0 - self.damping)
        force *= F32(self.dt / self.mass)
        vel += force
        np.multiply(vel, F32(self.dt), out=force)
        self.agent_pos += force
        if self.message_dim:
            self.messages[:] = message
        self.t += 1

        self.refresh()
        rewards = {GROUP: self._rules(old_pos), **self._other_rewards()}
        ended = self.t >= self.max_episode_steps
        if resetting.any():
            index = np.flatnonzero(resetting)
            self._reset_envs(index)
            for group_rewards in rewards.values():
                group_rewards[index] = 0.0
            ended[index] = False
            self.refresh()
        self._needs_reset = ended
        counted = ~resetting
        returns, lengths = self.tracker.update(rewards, counted, ended)
        obs, state = self.observe()
        sizes = {name: group.size for name, group in self.groups.items()}
        return MultiAgentStep(
            obs=obs,
            rewards=rewards,
            terminated={g: np.zeros((self.num_envs, k), bool) for g, k in sizes.items()},
            truncated={g: np.repeat(ended[:, None], k, axis=1) for g, k in sizes.items()},
            active={g: np.repeat(counted[:, None], k, axis=1) for g, k in sizes.items()},
            autoreset=resetting.copy(),
            state=state,
            episode_returns=returns,
            episode_lengths=lengths,
        )

    def render(self) -> np.ndarray:
        """A 250x250 RGB frame of env 0: agents blue (with their collision radius), landmarks
        dark grey (preys red, push zones light green); the view covers ``[-1, 1]^2`` and grows
        to keep every entity in sight."""
        return disc_frame(self._render_circles(), 250)

    def _derive(self) -> None:
        self.refresh()

    # ----------------------------------------------------------------- helpers

    def set_positions(
        self,
        env: int | slice = slice(None),
        *,
        agent_pos: Any = None,
        agent_vel: Any = None,
        landmark_pos: Any = None,
        landmark_vel: Any = None,
    ) -> None:
        """Hand-place entities of ``env`` (an index or slice of the batch); the rest of the
        state is kept. Marks the env started (no automatic reset on the next `step`)."""
        for name, value in (
            ("agent_pos", agent_pos),
            ("agent_vel", agent_vel),
            ("landmark_pos", landmark_pos),
            ("landmark_vel", landmark_vel),
        ):
            if value is not None:
                getattr(self, name)[env] = value
        self._started = True
        self.refresh()

    def refresh(self) -> None:
        """Recompute the cached geometry after the positions changed."""
        p = self.agent_pos
        np.subtract(p[:, :, None, :], p[:, None, :, :], out=self._delta)
        np.sqrt(np.einsum("bijk,bijk->bij", self._delta, self._delta), out=self._dist)
        np.subtract(self.landmark_pos[:, None, :, :], p[:, :, None, :], out=self._lrel)
        np.sqrt(np.einsum("bilk,bilk->bil", self._lrel, self._lrel), out=self._ldist)

    def observe(self) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Observations ``{"agent": [B, N, obs_dim]}`` and state ``[B, S]`` of the current
        configuration."""
        B, n, M = self.num_envs, self.num_agents, self.message_dim
        parts = self._observations()
        if M:
            parts.append(self.messages[:, self._others].reshape(B, n, (n - 1) * M))
        obs = np.concatenate(parts, axis=2)
        state = np.concatenate(
            [
                self.agent_pos.reshape(B, -1),
                self.agent_vel.reshape(B, -1),
                self.landmark_pos.reshape(B, -1),
                self.landmark_vel.reshape(B, -1),
                self.messages.reshape(B, -1),
            ],
            axis=1,
        )
        return {GROUP: obs, **self._other_observations()}, state

    def collisions(self) -> np.ndarray:
        """``[B, N]`` number of other agents each agent overlaps (distance < 2 * size)."""
        hit = self._dist < F32(2 * self.agent_size)
        hit &= self._not_self
        return hit.sum(axis=2)

    def landmark_cover(self) -> np.ndarray:
        """``[B]`` sum over landmarks of the distance to the closest agent."""
        return self._ldist.min(axis=1).sum(axis=1)

    # ----------------------------------------------------------------- internals

    def _decode(self, action: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        B, n = self.num_envs, self.num_agents
        action = np.asarray(action)
        if self.continuous:
            a = np.clip(action.reshape(B, n, 2 + self.message_dim), -1.0, 1.0).astype(F32)
            force = a[:, :, :2] * F32(self.accel)
            return force, (a[:, :, 2:] if self.message_dim else None)
        a = action.reshape(B, n).astype(np.intp, copy=False)
        return self._table[a], None

    def _reset_envs(self, index: np.ndarray) -> None:
        k, n, m = len(index), self.num_agents, self.num_landmarks
        self.agent_pos[index] = self.rng.uniform(-1.0, 1.0, (k, n, 2))
        self.landmark_pos[index] = self.rng.uniform(-1.0, 1.0, (k, m, 2))
        self.agent_vel[index] = 0.0
        self.landmark_vel[index] = 0.0
        self.messages[index] = 0.0
        self.t[index] = 0

    def _observations(self) -> list[np.ndarray]:
        B, n, m = self.num_envs, self.num_agents, self.num_landmarks
        if self.distance_observations:
            return [self._dist[:, self._rows, self._others], self._ldist]
        return [
            self.agent_vel,
            self.agent_pos,
            self._lrel.reshape(B, n, 2 * m),
            (-self._delta[:, self._rows, self._others]).reshape(B, n, 2 * (n - 1)),
        ]

    def _rules(self, old_pos: np.ndarray) -> np.ndarray:
        """Move rule-driven landmarks after the agents moved (``old_pos``: agent positions
        before the step), call `refresh` if anything moved, and return rewards ``[B, N]``
        float32 (a fresh array)."""
        raise NotImplementedError

    def _other_rewards(self) -> dict[str, np.ndarray]:
        """Rewards ``[B, N_g]`` of groups beside ``"agent"`` (a learning prey), after
        `_rules`."""
        return {}

    def _other_observations(self) -> dict[str, np.ndarray]:
        """Observations of groups beside ``"agent"``."""
        return {}

    def _team_reward(self) -> np.ndarray:
        """The paper tasks' base reward: minus the landmark cover distance (shared), minus
        the collision penalty for each other agent an agent overlaps."""
        reward = -self.collision_penalty * self.collisions().astype(F32)
        reward -= self.landmark_cover()[:, None]
        return reward

    def _render_circles(self) -> list[tuple[float, float, float, tuple[int, int, int]]]:
        circles = []
        for x, y in self.landmark_pos[0]:
            circles.append((float(x), float(y), self.landmark_size, (64, 64, 64)))
        for x, y in self.agent_pos[0]:
            circles.append((float(x), float(y), self.agent_size, (89, 89, 217)))
        return circles
