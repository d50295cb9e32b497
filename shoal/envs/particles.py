"""Vectorized multi-agent particle worlds (the MPE of Lowe et al. 2017), built in.

Every array holds the whole env batch ``[B, ...]``; a step is a few dozen numpy operations
whatever ``B`` is (no per-env Python loop). All envs implement the multi-agent vector-env
protocol of `shoal.envs.multi_agent`: one group ``"agent"`` with agents ``agent_0 ..
agent_{N-1}``, a global state for centralized critics, next-step autoreset, per-agent episode
returns (`EpisodeTracker`), ``get_state``/``set_state`` and an RGB ``render`` of env 0.

Registered ids (`register_multi_agent_env`; ``EnvConfig.kwargs`` go to the constructor,
``EnvConfig.max_episode_steps`` overrides the episode length):

==========================  ======  =========  =====  ==========================================
id                          agents  landmarks  steps  observation per agent
==========================  ======  =========  =====  ==========================================
``shoal/spread-v0``         3       3          25     vel, pos, landmark rel pos, others rel pos
``shoal/cn-v1-v0``          3       3          25     distances to others and to landmarks
``shoal/cn-v2-v0``          3       2          25     distances to others and to landmarks
``shoal/push-forward-v0``   3       3          50     distances to others and to landmarks
``shoal/predator-prey-v0``  3       2 (preys)  50     distances to others and to preys
==========================  ======  =========  =====  ==========================================

The last four are the benchmarks of reference 003 (CTEDD, section 5.1); see each class for
the choices made where the paper is vague. Every observation ends with the messages the
*other* agents sent on the previous step (agent order, ``message_dim`` each; zeros after a
reset).

Physics (MPE's constants, mpe2 ``_mpe_utils/core.py``): ``dt = 0.1``, damping 0.25, mass 1,
action sensitivity (MPE's ``accel``) 5.0, no maximum speed. Agents have size (radius) 0.15
and collide with each other through MPE's soft contact force: for every pair,
``penetration = k * log(1 + exp(-(dist - (size_a + size_b)) / k))`` with margin ``k = 1e-3``
and force ``1e2 * penetration * (p_a - p_b) / dist`` on ``a`` (opposite on ``b``). Landmarks
(size 0.05) never collide; they are static, or moved by rules (push forward, predator-prey).
Integration is semi-implicit Euler as in the original MPE and PettingZoo's MPE::

    velocity = velocity * (1 - damping) + force / mass * dt
    position = position + velocity * dt

(the installed mpe2 moves positions with the *old* velocity first; we keep the original
order). Initial agent and landmark positions are uniform in ``[-1, 1]^2``, velocities 0.

Actions (one per agent):

* ``continuous=False`` (default): ``Discrete(5)``: 0 no-op, 1 left (-x), 2 right (+x), 3 down
  (-y), 4 up (+y), as MPE; the force is 5.0 along that direction.
* ``continuous=True``: ``Box(-1, 1, (2 + message_dim,))``: the first two entries, clipped to
  ``[-1, 1]``, are the force along x and y (times 5.0; the discrete actions are the corners
  ``(+-1, 0)``, ``(0, +-1)``). mpe2's ``Box(0, 1, (5,))`` form ``(noop, -x, +x, -y, +y)`` maps
  to ours as ``(a[2] - a[1], a[4] - a[3])``. The remaining ``message_dim`` entries, clipped
  to ``[-1, 1]``, are the message the agent broadcasts; the others observe it on the next
  step. Messages need continuous actions (``message_dim`` > 0 with discrete actions is an
  error).

Global state ``[B, S]``: agent positions ``(2N)``, agent velocities ``(2N)``, landmark
positions ``(2L)``, landmark velocities ``(2L)`` (displacement / dt for rule-moved
landmarks), messages ``(N * message_dim)``.

Hand-placing a configuration (tests, demos): write the public arrays ``agent_pos``,
``agent_vel`` ``[B, N, 2]``, ``landmark_pos``, ``landmark_vel`` ``[B, L, 2]``, ``messages``
``[B, N, M]`` or ``t`` ``[B]`` (float32 / int), then call `ParticleEnv.refresh` (or use
`ParticleEnv.set_positions`, which does both); `ParticleEnv.observe` returns the
observations and state of the current configuration.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any, ClassVar

import gymnasium as gym
import numpy as np

from shoal.envs.multi_agent import (
    AgentGroup,
    EpisodeTracker,
    MultiAgentStep,
    register_multi_agent_env,
)
from shoal.errors import ConfigError

if TYPE_CHECKING:
    from shoal.config import EnvConfig

GROUP = "agent"
F32 = np.float32

# Discrete action -> unit direction, MPE order: no-op, left, right, down, up.
DIRECTIONS = np.array([[0, 0], [-1, 0], [1, 0], [0, -1], [0, 1]], F32)


class ParticleEnv:
    """Base particle world: physics, spaces, episodes, autoreset, snapshots and rendering.

    Subclasses set the defaults and implement `_rules` (landmark motion and rewards) and
    `_observations`.
    """

    env_id: ClassVar[str] = ""
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
        self._false = np.zeros((B, n), bool)
        self._started = False

    # ----------------------------------------------------------------- protocol

    def reset(self, seed: int | None = None) -> tuple[dict[str, np.ndarray], np.ndarray]:
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self._reset_envs(np.arange(self.num_envs))
        self._needs_reset[:] = False
        self.tracker = EpisodeTracker(self.num_envs, self.groups)
        self._started = True
        self.refresh()
        return self.observe()

    def step(self, actions: dict[str, np.ndarray]) -> MultiAgentStep:
        if not self._started:
            self.reset()
        n = self.num_agents
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
        rewards = self._rules(old_pos)
        ended = self.t >= self.max_episode_steps
        if resetting.any():
            index = np.flatnonzero(resetting)
            self._reset_envs(index)
            rewards[index] = 0.0
            ended[index] = False
            self.refresh()
        self._needs_reset = ended
        counted = ~resetting
        returns, lengths = self.tracker.update({GROUP: rewards}, counted, ended)
        obs, state = self.observe()
        return MultiAgentStep(
            obs=obs,
            rewards={GROUP: rewards},
            terminated={GROUP: self._false.copy()},
            truncated={GROUP: np.repeat(ended[:, None], n, axis=1)},
            active={GROUP: np.repeat(counted[:, None], n, axis=1)},
            autoreset=resetting.copy(),
            state=state,
            episode_returns=returns,
            episode_lengths=lengths,
        )

    def render(self) -> np.ndarray:
        """A 250x250 RGB frame of env 0: agents blue (with their collision radius), landmarks
        dark grey (preys red, push zones light green); the view covers ``[-1, 1]^2`` and grows
        to keep every entity in sight."""
        size = 250
        circles = self._render_circles()
        extent = max(
            1.0, max(abs(x) + r for x, _, r, _ in circles), *(abs(y) + r for _, y, r, _ in circles)
        )
        scale = size / (2 * extent)
        frame = np.full((size, size, 3), 255, np.uint8)
        centers = (np.arange(size, dtype=F32) + 0.5) / scale - extent
        xs, ys = centers[None, :], -centers[:, None]  # image rows go down, y goes up
        for x, y, r, color in circles:
            r = max(r, 1.5 / scale)
            mask = (xs - x) ** 2 + (ys - y) ** 2 <= r * r
            frame[mask] = color
        return frame

    def get_state(self) -> dict[str, Any]:
        return {
            "agent_pos": self.agent_pos.copy(),
            "agent_vel": self.agent_vel.copy(),
            "landmark_pos": self.landmark_pos.copy(),
            "landmark_vel": self.landmark_vel.copy(),
            "messages": self.messages.copy(),
            "t": self.t.copy(),
            "needs_reset": self._needs_reset.copy(),
            "started": self._started,
            "rng": self.rng.bit_generator.state,
            "tracker": self.tracker.state_dict(),
        }

    def set_state(self, state: dict[str, Any]) -> None:
        for name in ("agent_pos", "agent_vel", "landmark_pos", "landmark_vel", "messages", "t"):
            getattr(self, name)[:] = state[name]
        self._needs_reset = np.array(state["needs_reset"], bool)
        self._started = bool(state["started"])
        self.rng = np.random.default_rng()
        self.rng.bit_generator.state = state["rng"]
        self.tracker.load_state_dict(state["tracker"])
        self.refresh()

    def close(self) -> None:
        pass

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
        return {GROUP: obs}, state

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
    """``shoal/cn-v1-v0``: reference 003's Cooperative Navigation V1.

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
    """``shoal/cn-v2-v0``: reference 003's Cooperative Navigation V2.

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
    """``shoal/push-forward-v0``: reference 003's Push Forward.

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
    """``shoal/predator-prey-v0``: reference 003's Predator and Prey.

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

    def __init__(self, num_envs: int = 1, **kwargs: Any):
        super().__init__(num_envs, **kwargs)
        angles = np.arange(self.prey_directions) * (2 * np.pi / self.prey_directions)
        self._moves = (np.stack([np.cos(angles), np.sin(angles)], 1) * self.prey_step).astype(F32)

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
        self.evade()
        self.refresh()
        caught = self.captured()
        reward = self._team_reward()
        reward += (F32(self.capture_reward) * caught.sum(axis=1, dtype=F32))[:, None]
        if caught.any():
            self.landmark_pos[caught] = self.rng.uniform(-1.0, 1.0, (int(caught.sum()), 2))
            self.landmark_vel[caught] = 0.0
            self.refresh()
        return reward

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


def _factory(cls: type[ParticleEnv]):
    def make(config: EnvConfig) -> ParticleEnv:
        try:
            return cls(config.num_envs, max_episode_steps=config.max_episode_steps, **config.kwargs)
        except TypeError as error:
            raise ConfigError(f"{cls.env_id}: bad env.kwargs {config.kwargs}: {error}") from None

    return make


for _id, _cls in ENVS.items():
    register_multi_agent_env(_id, _factory(_cls))
