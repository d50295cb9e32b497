"""``shoal/intersection-v0``: four autonomous vehicles cross a 4-lane intersection among
background traffic, batched over ``[num_envs, ...]`` (the scenario of Biswas and Biswas,
"Autonomous driving using Multi-Agent RL", built in instead of SMARTS).

The layout is `shoal.envs.intersection.geometry`'s: four arms with two lanes each way, a
signal-free box, or with ``signals=True`` traffic lights at the box's edges (`SIGNAL_CYCLE`:
north-south green 12 s, yellow 3 s, all red 1 s, then east-west the same; each episode
starts at a random point of the cycle). Agent ``i`` enters on arm ``i`` (south, east, north,
west) 15 m into the arm, at 8 m/s, on a route drawn at each reset (``routes="random"``: lane
and turn, right turns from the kerb lane, left turns from the left lane) or the fixed one of
its arm (``routes="fixed"``: south straight, east left, north right, west straight).

**Dynamics** (`shoal.envs.intersection.dynamics`): agents move by the kinematic bicycle
model at 0.1 s steps. With discrete actions (the paper's lane-following controls: 0 keep
lane, 1 slow down, 2 change right, 3 change left) a Stanley steering law (Thrun et al. 2006)
tracks the route's centreline shifted by the chosen lane offset, and the speed goes toward
10 m/s (keep lane) or brakes at 4 m/s^2 (slow down); lane changes shift the target by one
lane within the road. With ``continuous=True`` an action is ``(throttle, brake, steering)``
in ``[0, 1] x [0, 1] x [-1, 1]``: acceleration ``2 throttle - 6 brake`` m/s^2 and steering
``0.6 steering`` rad. Background vehicles follow their routes exactly under IDM; their
leader is the closest vehicle ahead within 2.5 m of their heading line (the car in their
lane, or one crossing their path in the box), which makes them yield; with signals, a red
light (or a yellow one they can stop for at 3 m/s^2) is a standing leader at their stop
line. They enter the arms' ends at ``traffic`` vehicles per minute over the eight entry
lanes ("low" 10, "high" 30, or a number), when the entry is clear and a slot of the
``background`` ones is free, and leave at their route's end.

**Observations** (per agent, in its own frame, the paper's list without the bird's-eye
image): the goal (its route's end) relative to it (2, /50 m), the distance to its target
lane centre (1, m), speed (1, /10 m/s), steering (1, rad), heading errors to the route 5, 10
and 20 m ahead (3, rad), and the 8 closest vehicles within 50 m: relative position (2, /50
m), distance (1, /50 m), speed (1, /10 m/s), a presence flag (1), nearest first, zeros past
the last. Options: ``grid=G`` appends a bird's-eye occupancy grid of ``G x G`` cells of
``grid_cell`` metres centred on the vehicle and turned with it (x ahead, y left), two
channels (road, other vehicles' discs), 0/1 values computed as uint8 and appended to the
float vector (``2 G^2`` entries, road first, row-major); ``frames=k`` stacks the last ``k``
observations, oldest first (a new episode repeats its first); ``signals=True`` appends the
agent's own light (1 green, 0.5 yellow, 0 red) to each frame. The global state holds every
vehicle's position (/50), heading (cos, sin), speed (/10) and presence (and with signals the
four arms' lights).

**Rewards** per agent and step: 0.1 per metre of progress along its route, +10 on
completing it (within 3 m of its end), -10 on a collision (vehicles are two discs of radius
1 m, 2.5 m apart), -5 on leaving the road (more than two lanes from its route's centreline),
and with signals -5 for entering the box on red.
An agent that completes, collides or leaves the road is done: it leaves the road and stays
in the arrays masked (``active`` False) until its env resets, which happens when all four
are done (terminated) or after ``max_episode_steps`` (300, 30 s; truncated).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np

from shoal.config import EnvConfig
from shoal.envs.batched import BatchedWorld, disc_frame, factory
from shoal.envs.intersection.dynamics import (
    IDMParams,
    bicycle_step,
    clip,
    idm_acceleration,
    wrap_angle,
)
from shoal.envs.intersection.geometry import Layout, build_routes, point_at, project
from shoal.envs.multi_agent import (
    AgentGroup,
    EpisodeTracker,
    MultiAgentStep,
    register_multi_agent_env,
)
from shoal.errors import ConfigError

GROUP = "agent"
AGENTS = 4
TRAFFIC = {"none": 0.0, "low": 10.0, "high": 30.0}
"""Background vehicles per minute entering over all eight entry lanes."""
FIXED_ROUTES = ((1, "straight"), (0, "left"), (1, "right"), (1, "straight"))
"""``routes="fixed"``: (lane, turn) of the agent entering on arm 0, 1, 2, 3."""
OBS_DIM = 8 + 8 * 5
SIGNAL_CYCLE = ((12.0, 2, 0), (3.0, 1, 0), (1.0, 0, 0), (12.0, 0, 2), (3.0, 0, 1), (1.0, 0, 0))
"""``signals=True``: the phases' (seconds, north-south light, east-west light), lights 0 red,
1 yellow, 2 green."""
SCALE, SPEED_SCALE = 50.0, 10.0


def flag(value: Any, name: str) -> bool:
    """A yes/no option given as a bool or as text (``true``/``false`` from a command line)."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    text = str(value).strip().lower()
    if text in ("true", "yes", "1", "on"):
        return True
    if text in ("false", "no", "0", "off"):
        return False
    raise ConfigError(f"shoal/intersection-v0: {name} is true or false, not {value!r}")


class IntersectionEnv(BatchedWorld):
    env_id: ClassVar[str] = "shoal/intersection-v0"
    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["rgb_array"], "render_fps": 10}
    dt = 0.1
    target_speed, brake = 10.0, 4.0
    disc_radius, disc_offset = 1.0, 1.25
    neighbours, sensor_range = 8, 50.0
    lookahead = (5.0, 10.0, 20.0)
    progress_weight, completion_bonus = 0.1, 10.0
    collision_penalty, off_road_penalty, red_light_penalty = 10.0, 5.0, 5.0
    stanley_gain = 1.0
    state_arrays = ("route", "pos", "heading", "speed", "present", "s", "steer", "offset",
                    "done", "outcome", "finish_time", "t", "_s_now", "_lateral",
                    "_path_heading", "_frames", "_frame_t", "signal_offset")  # fmt: skip

    def __init__(
        self,
        num_envs: int = 1,
        *,
        traffic: str | float = "low",
        routes: str = "random",
        continuous: bool = False,
        background: int = 12,
        grid: int = 0,
        grid_cell: float = 2.0,
        frames: int = 1,
        signals: bool = False,
        max_episode_steps: int | None = None,
        seed: int | None = None,
    ):
        if isinstance(traffic, str):
            if traffic not in TRAFFIC:
                raise ConfigError(
                    f"{self.env_id}: traffic must be one of {list(TRAFFIC)} or vehicles per "
                    f"minute, not {traffic!r}"
                )
            traffic = TRAFFIC[traffic]
        if not 0.0 <= float(traffic) <= 120.0:
            raise ConfigError(
                f"{self.env_id}: traffic = {traffic} vehicles/min is outside [0, 120]"
            )
        if routes not in ("random", "fixed"):
            raise ConfigError(f"{self.env_id}: routes must be 'random' or 'fixed', not {routes!r}")
        if num_envs < 1 or background < 0:
            raise ConfigError(f"{self.env_id}: num_envs >= 1 and background >= 0 needed")
        if not (grid == 0 or 4 <= grid <= 64) or not 0.5 <= grid_cell <= 10.0:
            raise ConfigError(
                f"{self.env_id}: grid is 0 (off) or 4..64 cells a side and grid_cell 0.5..10 m, "
                f"not grid={grid}, grid_cell={grid_cell}"
            )
        if not 1 <= frames <= 8:
            raise ConfigError(f"{self.env_id}: frames (observations stacked) is 1..8, not {frames}")
        self.grid, self.grid_cell, self.frames = int(grid), float(grid_cell), int(frames)
        self.signals = flag(signals, "signals")
        self.frame_dim = OBS_DIM + 2 * self.grid**2 + self.signals
        self.num_envs = B = int(num_envs)
        self.vehicles_per_minute = float(traffic)
        self.fixed_routes, self.continuous = routes == "fixed", flag(continuous, "continuous")
        self.max_episode_steps = int(max_episode_steps or 300)
        self.layout = Layout()
        self.routes = build_routes(self.layout)
        self.idm = IDMParams(desired_speed=self.target_speed)
        agents = tuple(f"agent_{i}" for i in range(AGENTS))
        obs = gym.spaces.Box(-np.inf, np.inf, (self.frame_dim * self.frames,), np.float32)
        action: gym.Space = (
            gym.spaces.Box(np.array([0, 0, -1], np.float32), np.array([1, 1, 1], np.float32))
            if self.continuous
            else gym.spaces.Discrete(4)
        )
        self.groups = {GROUP: AgentGroup(GROUP, agents, obs, action)}
        self.V = V = AGENTS + int(background)
        self.state_space = gym.spaces.Box(-np.inf, np.inf, (V * 6 + 4 * self.signals,), np.float32)
        # Per vehicle (agents first): route, pose, speed, presence.
        self.route = np.zeros((B, V), np.int64)
        self.pos = np.zeros((B, V, 2))
        self.heading = np.zeros((B, V))
        self.speed = np.zeros((B, V))
        self.present = np.zeros((B, V), bool)
        self.s = np.zeros((B, V))
        """Arc length along the route (background vehicles; agents' last projection)."""
        self.steer = np.zeros((B, AGENTS))
        self.offset = np.zeros((B, AGENTS))
        """Agents' target offset from their route's centreline (lane changes)."""
        self.done = np.zeros((B, AGENTS), bool)
        self.outcome = np.zeros((B, AGENTS), np.int64)
        """How each agent's episode went so far: 0 driving, 1 completed, 2 collided, 3 off
        the road (`episode_info`)."""
        self.finish_time = np.full((B, AGENTS), np.nan)
        self._s_now = np.zeros((B, AGENTS))
        self._lateral = np.zeros((B, AGENTS))
        self._path_heading = np.zeros((B, AGENTS))
        self.t = np.zeros(B, np.int64)
        self.signal_offset = np.zeros(B)
        """Where in `SIGNAL_CYCLE` (seconds) each env's episode began."""
        self._frames = np.zeros((B, AGENTS, self.frames, self.frame_dim), np.float32)
        self._frame_t = np.full(B, -1, np.int64)
        """The stacked observations and the step ``t`` of the newest (`frames`)."""
        self._needs_reset = np.zeros(B, bool)
        self._started = False
        self.rng = np.random.default_rng(seed)
        self.tracker = EpisodeTracker(B, self.groups)
        entry = [(arm, lane) for arm in range(4) for lane in (0, 1)]
        self._entry_routes = [
            [r for r, key in enumerate(self.routes.keys) if key[:2] == e] for e in entry
        ]
        self._entry_points = np.array([self.routes.points[rs[0], 0] for rs in self._entry_routes])
        self._route_lane = np.array([key[1] for key in self.routes.keys])
        self._route_arm = np.array([key[0] for key in self.routes.keys])
        self._route_turn = np.array([key[2] for key in self.routes.keys])
        self._phase_ends = np.cumsum([p[0] for p in SIGNAL_CYCLE])
        self._phase_lights = np.array([p[1:] for p in SIGNAL_CYCLE])[:, [0, 1, 0, 1]]

    # ----------------------------------------------------------------- protocol

    def step(self, actions: dict[str, np.ndarray]) -> MultiAgentStep:
        if not self._started:
            self.reset()
        resetting = self._needs_reset.copy()
        real = ~resetting
        acting = ~self.done & real[:, None]
        s_before = self.s[:, :AGENTS].copy()
        self._drive_agents(np.asarray(actions[GROUP]), acting)
        self._drive_background(real)
        self._update_projection()
        s_now, lateral, _ = self._project_agents()
        self.s[:, :AGENTS] = np.where(acting, s_now, s_before)
        collided = self._collisions() & acting
        length = self.routes.length[self.route[:, :AGENTS]]
        completed = (s_now >= length - 3.0) & acting & ~collided
        off_road = (np.abs(lateral) > 2 * self.layout.lane_width) & acting & ~collided & ~completed
        reward = self.progress_weight * (s_now - s_before)
        reward += self.completion_bonus * completed - self.collision_penalty * collided
        reward -= self.off_road_penalty * off_road
        if self.signals:  # entered the box this step while its light was red
            stop = self.layout.arm_length
            arm = self._route_arm[self.route[:, :AGENTS]]
            red = np.take_along_axis(self.lights(), arm, 1) == 0
            crossed = (s_before < stop) & (s_now >= stop) & acting & red
            reward -= self.red_light_penalty * crossed
        reward = np.where(acting, reward, 0.0).astype(np.float32)
        finished = collided | completed | off_road
        self.outcome = np.where(
            completed, 1, np.where(collided, 2, np.where(off_road, 3, self.outcome))
        )
        self.finish_time = np.where(completed, (self.t + 1)[:, None] * self.dt, self.finish_time)
        self.done |= finished
        self.present[:, :AGENTS] &= ~self.done  # done agents leave the road
        self.t += real
        all_done = self.done.all(axis=1) & real
        timeout = real & (self.t >= self.max_episode_steps) & ~all_done
        truncated = timeout[:, None] & acting & ~finished
        self._spawn(real)
        info = self._episode_info(all_done | timeout)
        if resetting.any():
            self._reset_envs(np.flatnonzero(resetting))
        ended = all_done | timeout
        self._needs_reset = ended
        returns, lengths = self.tracker.update({GROUP: reward}, real, ended)
        obs, state = self.observe()
        return MultiAgentStep(
            obs=obs,
            rewards={GROUP: reward},
            terminated={GROUP: finished},
            truncated={GROUP: truncated},
            active={GROUP: acting},
            autoreset=resetting,
            state=state,
            episode_returns=returns,
            episode_lengths=lengths,
            episode_info=info,
        )

    def _episode_info(self, ended: np.ndarray) -> dict[str, np.ndarray] | None:
        """Per ended env: the share of its agents that completed, collided or left the
        road, and the mean time (s) the completing ones took (NaN if none did)."""
        if not ended.any():
            return None
        outcome = self.outcome[ended]
        times = self.finish_time[ended]
        some = ~np.isnan(times).all(axis=1)
        time_to_complete = np.full(len(times), np.nan)
        time_to_complete[some] = np.nanmean(times[some], axis=1)
        return {
            "completion_rate": (outcome == 1).mean(axis=1),
            "collision_rate": (outcome == 2).mean(axis=1),
            "off_road_rate": (outcome == 3).mean(axis=1),
            "time_to_complete": time_to_complete,
        }

    def observe(self) -> tuple[dict[str, np.ndarray], np.ndarray]:
        B, A = self.num_envs, AGENTS
        pos, heading = self.pos[:, :A], self.heading[:, :A]
        c, s = np.cos(heading), np.sin(heading)

        def ego(v: np.ndarray) -> np.ndarray:  # world vectors [B, A, ..., 2] -> agent frame
            cc, ss = c.reshape(B, A, *([1] * (v.ndim - 3))), s.reshape(B, A, *([1] * (v.ndim - 3)))
            return np.stack([cc * v[..., 0] + ss * v[..., 1], -ss * v[..., 0] + cc * v[..., 1]], -1)

        routes = self.route[:, :A]
        rows = routes.reshape(-1)
        ends = self.routes.points[rows, self.routes.count[rows] - 1].reshape(B, A, 2)
        s_now, lateral, _ = self._project_agents()
        ahead = s_now[..., None] + np.array(self.lookahead)  # [B, A, 3], one lookup
        _, path = point_at(self.routes, np.repeat(rows, len(self.lookahead)), ahead.reshape(-1))
        errors = wrap_angle(path.reshape(ahead.shape) - heading[..., None])
        rel = self.pos[:, None, :, :] - pos[:, :, None, :]  # [B, A, V, 2]
        dist = np.sqrt((rel * rel).sum(-1))
        seen = self.present[:, None, :] & (dist <= self.sensor_range)
        seen[:, np.arange(A), np.arange(A)] = False
        order = np.argsort(np.where(seen, dist, np.inf), axis=2)[:, :, : self.neighbours]
        b_, a_ = np.arange(B)[:, None, None], np.arange(A)[None, :, None]
        n_seen = seen[b_, a_, order]
        n_rel = ego(rel[b_, a_, order]) / SCALE
        n_dist = dist[b_, a_, order] / SCALE
        n_speed = self.speed[b_, order] / SPEED_SCALE
        neighbours = (
            np.concatenate([n_rel, n_dist[..., None], n_speed[..., None], n_seen[..., None]], -1)
            * n_seen[..., None]
        )
        own = [
            ego(ends - pos) / SCALE,
            (lateral - self.offset)[..., None],
            self.speed[:, :A, None] / SPEED_SCALE,
            self.steer[..., None],
            errors,
            neighbours.reshape(B, A, -1),
        ]
        if self.grid:
            own.append(self._occupancy().reshape(B, A, -1))
        if self.signals:
            own.append(np.take_along_axis(self.lights(), self._route_arm[routes], 1)[..., None] / 2)
        obs = self._stack(np.concatenate(own, -1).astype(np.float32))
        state = np.concatenate(
            [
                self.pos / SCALE,
                np.cos(self.heading)[..., None],
                np.sin(self.heading)[..., None],
                self.speed[..., None] / SPEED_SCALE,
                self.present[..., None],
            ],
            -1,
        ).reshape(B, -1)
        if self.signals:
            state = np.concatenate([state, self.lights() / 2], -1)
        return {GROUP: obs}, state.astype(np.float32)

    def _occupancy(self) -> np.ndarray:
        """``[B, A, 2, G, G]`` uint8: road and other vehicles' discs in the cells around each
        agent (cell ``[i, j]``: ``i`` ahead, ``j`` to the left, the vehicle at the centre)."""
        B, A, G, cell = self.num_envs, AGENTS, self.grid, self.grid_cell
        centres = (np.arange(G) - (G - 1) / 2) * cell
        local = np.stack(np.meshgrid(centres, centres, indexing="ij"), -1).reshape(-1, 2)
        c, s = np.cos(self.heading[:, :A]), np.sin(self.heading[:, :A])
        rot = np.stack([np.stack([c, -s], -1), np.stack([s, c], -1)], -2)  # [B, A, 2, 2]
        world = self.pos[:, :A, None, :] + np.einsum("baij,kj->baki", rot, local)
        lanes, extent = 2 * self.layout.lane_width, self.layout.half + self.layout.arm_length
        x, y = np.abs(world[..., 0]), np.abs(world[..., 1])
        road = ((x <= lanes) | (y <= lanes)) & (x <= extent) & (y <= extent)
        grid = np.zeros((B, A, 2, G * G), np.uint8)
        grid[:, :, 0] = road
        discs = self._discs().reshape(B, 1, -1, 2)  # [B, 1, 2V, 2]: vehicle v's discs 2v, 2v+1
        rel = discs - self.pos[:, :A, None, :]
        ahead = c[..., None] * rel[..., 0] + s[..., None] * rel[..., 1]
        left = -s[..., None] * rel[..., 0] + c[..., None] * rel[..., 1]
        i = np.floor(ahead / cell + G / 2).astype(np.int64)
        j = np.floor(left / cell + G / 2).astype(np.int64)
        other = np.repeat(self.present, 2, axis=1)[:, None, :] & (
            np.arange(2 * self.V)[None, None, :] // 2 != np.arange(A)[None, :, None]
        )
        hit = other & (i >= 0) & (i < G) & (j >= 0) & (j < G)
        b, a, k = np.nonzero(hit)
        grid[b, a, 1, i[b, a, k] * G + j[b, a, k]] = 1
        return grid.reshape(B, A, 2, G, G)

    def _stack(self, frame: np.ndarray) -> np.ndarray:
        """The last `frames` observations ``[B, A, frames * frame_dim]``, oldest first: a
        new frame where ``t`` moved on, the first one repeated where an episode began (``t``
        0), and the newest replaced where ``t`` did not move (observing twice is harmless)."""
        if self.frames == 1:
            return frame
        fresh = self.t == 0
        moved = ~fresh & (self.t != self._frame_t)
        self._frames[moved] = np.roll(self._frames[moved], -1, axis=2)
        self._frames[:, :, -1] = frame
        self._frames[fresh] = frame[fresh][:, :, None]
        self._frame_t[:] = self.t
        return self._frames.reshape(self.num_envs, AGENTS, -1).copy()

    def render(self) -> np.ndarray:
        """A 240x240 RGB frame of env 0: roads grey, agents in colour, other cars dark (and the
        traffic lights with signals)."""
        road = 2 * self.layout.lane_width

        def roads(frame: np.ndarray, xs: np.ndarray, ys: np.ndarray) -> None:
            frame[(np.abs(xs) <= road) | (np.abs(ys) <= road)] = (128, 128, 128)

        colours = [(220, 60, 60), (60, 120, 220), (230, 200, 40), (200, 90, 220)]
        discs = self._discs()[0]
        cars = [
            (x, y, self.disc_radius, colours[v] if v < AGENTS else (40, 40, 40))
            for v in np.flatnonzero(self.present[0])
            for x, y in discs[v]
        ]
        if self.signals:  # a light beside each arm's entry lanes, at the box's edge
            lamp = [(200, 30, 30), (240, 200, 30), (40, 200, 60)]
            h, w = self.layout.half, self.layout.lane_width
            for arm, light in enumerate(self.lights()[0]):
                angle = arm * np.pi / 2
                x, y = 2.6 * w, -h - 1.5  # south arm's kerb side, turned to the arm
                c, s = np.cos(angle), np.sin(angle)
                cars.append((c * x - s * y, s * x + c * y, 1.2, lamp[light]))
        extent = self.layout.half + self.layout.arm_length
        return disc_frame(cars, 240, extent, background=(96, 160, 96), paint=roads)

    # ----------------------------------------------------------------- internals

    def _project_agents(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The agents' arc length, lateral offset and route heading, ``[B, A]`` each, as
        projected when they last moved (`_update_projection`)."""
        return self._s_now, self._lateral, self._path_heading

    def _update_projection(self, envs: np.ndarray | None = None) -> None:
        """Project the agents of ``envs`` (all by default) onto their routes, searching
        near their last arc length."""
        A = AGENTS
        rows = slice(None) if envs is None else envs
        route = self.route[rows, :A]
        shape = route.shape
        s, d, h = project(
            self.routes,
            route.reshape(-1),
            self.pos[rows, :A].reshape(-1, 2),
            near=self.s[rows, :A].reshape(-1),
        )
        self._s_now[rows] = s.reshape(shape)
        self._lateral[rows] = d.reshape(shape)
        self._path_heading[rows] = h.reshape(shape)

    def _drive_agents(self, actions: np.ndarray, acting: np.ndarray) -> None:
        B, A = self.num_envs, AGENTS
        speed, heading = self.speed[:, :A], self.heading[:, :A]
        if self.continuous:
            a = clip(actions.reshape(B, A, 3), [0, 0, -1], [1, 1, 1])
            accel = 2.0 * a[..., 0] - 6.0 * a[..., 1]
            steer = 0.6 * a[..., 2]
        else:
            a = actions.reshape(B, A).astype(np.int64)
            w = self.layout.lane_width
            own_lane = self._route_lane[self.route[:, :A]]  # 0: left lane (may go right)
            low, high = np.where(own_lane == 0, -w, 0.0), np.where(own_lane == 0, 0.0, w)
            shift = np.where(a == 2, -w, np.where(a == 3, w, 0.0))
            self.offset = np.where(acting, clip(self.offset + shift, low, high), self.offset)
            accel = self._lane_accel(a, speed)
            _, lateral, path = self._project_agents()
            cross = np.arctan(self.stanley_gain * (lateral - self.offset) / (speed + 1.0))
            steer = wrap_angle(path - heading) - cross
        x, y, h, v = bicycle_step(
            self.pos[:, :A, 0], self.pos[:, :A, 1], heading, speed, accel, steer, self.dt
        )
        keep = ~acting
        self.pos[:, :A, 0] = np.where(keep, self.pos[:, :A, 0], x)
        self.pos[:, :A, 1] = np.where(keep, self.pos[:, :A, 1], y)
        self.heading[:, :A] = np.where(keep, heading, h)
        self.speed[:, :A] = np.where(keep, speed, v)
        self.steer = np.where(keep, self.steer, clip(steer, -0.6, 0.6))

    def lights(self) -> np.ndarray:
        """``[B, 4]``: each arm's light now, 0 red, 1 yellow, 2 green (all green without
        ``signals``)."""
        if not self.signals:
            return np.full((self.num_envs, 4), 2)
        time = (self.signal_offset + self.t * self.dt) % self._phase_ends[-1]
        return self._phase_lights[np.searchsorted(self._phase_ends, time, side="right")]

    def _lane_accel(self, actions: np.ndarray, speed: np.ndarray) -> np.ndarray:
        """The discrete actions' acceleration: toward `target_speed` at +2/-3 m/s^2, or
        braking at `brake` (slow down, action 1)."""
        return np.where(actions == 1, -self.brake, clip(self.target_speed - speed, -3.0, 2.0))

    def _drive_background(self, real: np.ndarray) -> None:
        A = AGENTS
        moving = self.present[:, A:] & real[:, None]
        if not moving.any():
            return
        c, s = np.cos(self.heading[:, A:]), np.sin(self.heading[:, A:])
        rel = self.pos[:, None, :, :] - self.pos[:, A:, None, :]  # [B, M, V, 2]
        ahead = c[..., None] * rel[..., 0] + s[..., None] * rel[..., 1]
        side = -s[..., None] * rel[..., 0] + c[..., None] * rel[..., 1]
        blocking = self.present[:, None, :] & (ahead > 0.1) & (np.abs(side) < 2.5)
        gap_to = np.where(blocking, ahead, np.inf)
        leader = np.argmin(gap_to, axis=2)
        gap = np.take_along_axis(gap_to, leader[..., None], 2)[..., 0] - 2 * self.disc_offset - 2.0
        lead_speed = np.take_along_axis(self.speed, leader, 1)
        if self.signals:  # a red light, or a yellow one it can stop for, stands at the line
            light = np.take_along_axis(self.lights(), self._route_arm[self.route[:, A:]], 1)
            to_line = self.layout.arm_length - self.s[:, A:] - self.disc_offset - self.disc_radius
            can_stop = self.speed[:, A:] ** 2 / 6.0 <= to_line
            stop = (to_line > -0.5) & ((light == 0) | ((light == 1) & can_stop)) & (to_line < gap)
            gap = np.where(stop, to_line, gap)
            lead_speed = np.where(stop, 0.0, lead_speed)
        approach = np.where(np.isinf(gap), 0.0, self.speed[:, A:] - lead_speed)
        accel = idm_acceleration(self.speed[:, A:], gap, approach, self.idm)
        speed = clip(self.speed[:, A:] + accel * self.dt, 0.0, self.target_speed * 1.2)
        s_new = self.s[:, A:] + speed * self.dt
        routes = self.route[:, A:]
        point, heading = point_at(self.routes, routes.reshape(-1), s_new.reshape(-1))
        shape = routes.shape
        self.speed[:, A:] = np.where(moving, speed, self.speed[:, A:])
        self.s[:, A:] = np.where(moving, s_new, self.s[:, A:])
        self.pos[:, A:] = np.where(moving[..., None], point.reshape(*shape, 2), self.pos[:, A:])
        self.heading[:, A:] = np.where(moving, heading.reshape(shape), self.heading[:, A:])
        arrived = moving & (s_new >= self.routes.length[routes] - 0.5)
        self.present[:, A:] &= ~arrived

    def _spawn(self, real: np.ndarray) -> None:
        """New background vehicles at clear entries, ``vehicles_per_minute`` in all."""
        if self.vehicles_per_minute <= 0 or self.V == AGENTS:
            return
        chance = self.vehicles_per_minute / 60.0 * self.dt / len(self._entry_routes)
        draws = self.rng.random((self.num_envs, len(self._entry_routes)))
        arrivals = (draws < chance) & real[:, None]
        for e in np.flatnonzero(arrivals.any(axis=0)):
            candidates = self._entry_routes[e]
            envs = np.flatnonzero(arrivals[:, e])
            gap = self.pos[envs] - self._entry_points[e]
            clear = ~((np.sqrt((gap * gap).sum(-1)) < 10.0) & self.present[envs]).any(1)
            free = ~self.present[envs, AGENTS:]
            envs, free = envs[clear & free.any(1)], free[clear & free.any(1)]
            if not envs.size:
                continue
            slot = AGENTS + np.argmax(free, axis=1)
            route = np.array(candidates)[self.rng.integers(len(candidates), size=envs.size)]
            self._place(envs, slot, route, np.zeros(envs.size), 8.0)

    def _place(
        self, envs: np.ndarray, slots: np.ndarray, route: np.ndarray, s, speed, fresh: bool = True
    ) -> None:
        """Put vehicles ``slots`` of ``envs`` on ``route`` at arc length ``s``; ``fresh``:
        update the agents' projections now (a reset does it once for all four)."""
        point, heading = point_at(self.routes, route, np.asarray(s, np.float64))
        self.route[envs, slots] = route
        self.pos[envs, slots] = point
        self.heading[envs, slots] = heading
        self.speed[envs, slots] = speed
        self.s[envs, slots] = s
        self.present[envs, slots] = True
        agents = slots < AGENTS
        if fresh and agents.any():
            self._update_projection(np.unique(envs[agents]))

    def _reset_envs(self, envs: np.ndarray) -> None:
        k = envs.size
        self.present[envs] = False
        for i in range(AGENTS):
            if self.fixed_routes:
                lane, turn = FIXED_ROUTES[i]
                route = np.full(k, self.routes.index(i, lane, turn))
            else:
                options = [r for r, key in enumerate(self.routes.keys) if key[0] == i]
                route = np.array(options)[self.rng.integers(len(options), size=k)]
            self._place(envs, np.full(k, i), route, np.full(k, 15.0), 8.0, fresh=False)
        self.steer[envs] = 0.0
        self.offset[envs] = 0.0
        self.done[envs] = False
        self.outcome[envs] = 0
        self.finish_time[envs] = np.nan
        self.t[envs] = 0
        if self.signals:
            self.signal_offset[envs] = self.rng.uniform(0.0, self._phase_ends[-1], k)
        self._update_projection(envs)

    def _discs(self) -> np.ndarray:
        """``[B, V, 2, 2]``: the centres of each vehicle's rear and front disc."""
        direction = np.stack([np.cos(self.heading), np.sin(self.heading)], -1)
        return self.pos[:, :, None, :] + np.array([-1.0, 1.0])[None, None, :, None] * (
            self.disc_offset * direction[:, :, None, :]
        )

    def _collisions(self) -> np.ndarray:
        """``[B, A]``: an agent's discs overlap another present vehicle's."""
        A = AGENTS
        discs = self._discs()
        mine = discs[:, :A, None, :, None, :]  # [B, A, 1, 2, 1, 2]
        theirs = discs[:, None, :, None, :, :]  # [B, 1, V, 1, 2, 2]
        diff = mine - theirs
        gap2 = np.einsum("...k,...k->...", diff, diff).min(axis=(3, 4))  # [B, A, V], squared
        touching = (gap2 < (2 * self.disc_radius) ** 2) & self.present[:, None, :]
        touching[:, np.arange(A), np.arange(A)] = False
        return touching.any(axis=2) & self.present[:, :A]


BACKENDS = ("builtin", "sumo")


def make_intersection(config: EnvConfig) -> IntersectionEnv:
    """``shoal/intersection-v0`` on the backend ``env.kwargs["backend"]`` names: ``builtin``
    (the default, this module) or ``sumo`` (`shoal.envs.intersection.sumo`)."""
    kwargs = dict(config.kwargs)
    backend = kwargs.pop("backend", "builtin")
    if backend not in BACKENDS:
        raise ConfigError(
            f"{IntersectionEnv.env_id}: backend must be one of {list(BACKENDS)}, not {backend!r} "
            "(SMARTS is shoal/smarts-intersection-v0)"
        )
    cls = IntersectionEnv
    if backend == "sumo":
        from shoal.envs.intersection.sumo import SumoIntersectionEnv, require_sumo

        require_sumo()
        cls = SumoIntersectionEnv
    return factory(cls)(dataclasses.replace(config, kwargs=kwargs))


register_multi_agent_env(IntersectionEnv.env_id, make_intersection)
