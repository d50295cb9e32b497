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

**Simulators** (`shoal.envs.intersection.simulators`): the env is given the part that moves
the vehicles, by ``backend``: the built-in kinematic simulator (default,
`shoal.envs.intersection.kinematic`), SUMO (`shoal.envs.intersection.sumo`) or SMARTS
(`shoal.envs.intersection.smarts`); observations, rewards and metrics are computed here, once,
from the vehicles they move. Built-in dynamics: agents move by the kinematic bicycle model at
0.1 s steps. With discrete actions (the paper's lane-following controls: 0 keep
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
m), distance (1, /50 m), speed (1, /10 m/s), a presence flag (1) and velocity relative to the
agent's (2, /10 m/s), nearest first, zeros past the last (64 entries). Options: ``grid=G``
appends a bird's-eye occupancy grid of ``G x G`` cells of ``grid_cell`` metres centred on the
vehicle and turned with it (x ahead, y left), two channels (road, other vehicles' discs), 0/1
values computed as uint8 and appended to the float vector (``2 G^2`` entries, road first,
row-major); ``frames=k`` stacks the last ``k`` observations, oldest first (a new episode
repeats its first); ``signals=True`` appends the agent's own light (1 green, 0.5 yellow, 0
red) to each frame. The global state holds every
vehicle's position (/50), heading (cos, sin), speed (/10) and presence (and with signals the
four arms' lights).

**Rewards** per agent and step: 0.1 per metre of progress along its route, +10 on
completing it (within 3 m of its end), -10 on a collision (vehicles are two discs of radius
1 m, 2.5 m apart), -5 on leaving the road (more than two lanes from its route's centreline),
and with signals -5 for entering the box on red.
An agent that completes, collides or leaves the road is done: it leaves the road and stays
in the arrays masked (``active`` False) until its env resets, which happens when all four
are done (terminated) or after ``max_episode_steps`` simulator steps (300, 30 s; truncated).

**Decisions**: an agent acts every ``decision_steps`` simulator steps (default 1: every
0.1 s, as SMARTS steps); its action is held in between and the env's step returns the sum of
the rewards of those simulator steps, with observations at the end. Holding "slow down" for
0.5 s is a 2 m/s braking a policy can choose in one decision, where at 0.1 s it takes five
consecutive ones.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import gymnasium as gym
import numpy as np

from shoal.config import EnvConfig
from shoal.core.errors import ConfigError
from shoal.envs.batched import BatchedWorld, disc_frame, factory
from shoal.envs.intersection.observations import (
    OBS_DIM,
    agent_features,
    global_state,
    occupancy,
)
from shoal.envs.intersection.scenario import (
    AGENTS,
    ENV_ID,
    GROUP,
    START_S,
    START_SPEED,
    Scenario,
)
from shoal.envs.intersection.simulators import make_simulator
from shoal.envs.intersection.vehicles import Vehicles
from shoal.envs.multi_agent import (
    AgentGroup,
    EpisodeTracker,
    MultiAgentStep,
    register_multi_agent_env,
)

SMARTS_ID = "shoal/smarts-intersection-v0"

VEHICLE_STATE = {
    **{name: name for name in ("route", "pos", "heading", "speed", "present", "s", "steer")},
    "offset": "target_offset",
    "_s_now": "s_now",
    "_lateral": "lateral",
    "_path_heading": "path_heading",
}
"""Checkpoint name -> `Vehicles` array (the names of the env's state since shoal 0.1)."""


class IntersectionEnv(BatchedWorld):
    """The intersection environment (see the module docstring). ``backend`` names the
    simulator that moves the vehicles (`shoal.envs.intersection.simulators`); further
    keyword arguments are that simulator's options."""

    env_id: str = ENV_ID
    metadata: dict[str, Any] = {"render_modes": ["rgb_array"], "render_fps": 10}
    neighbours, sensor_range = 8, 50.0
    lookahead = (5.0, 10.0, 20.0)
    progress_weight, completion_bonus = 0.1, 10.0
    collision_penalty, off_road_penalty, red_light_penalty = 10.0, 5.0, 5.0
    state_arrays = ("done", "outcome", "finish_time", "t", "_frames", "_frame_t",
                    "signal_offset")  # fmt: skip

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
        decision_steps: int = 1,
        seed: int | None = None,
        backend: str = "builtin",
        env_id: str = ENV_ID,
        **simulator_options: Any,
    ):
        self.env_id = env_id
        self.scenario = sc = Scenario(
            num_envs, traffic=traffic, routes=routes, continuous=continuous,
            background=background, signals=signals, env_id=env_id,
        )  # fmt: skip
        if not (grid == 0 or 4 <= grid <= 64) or not 0.5 <= grid_cell <= 10.0:
            raise ConfigError(
                f"{env_id}: grid is 0 (off) or 4..64 cells a side and grid_cell 0.5..10 m, "
                f"not grid={grid}, grid_cell={grid_cell}"
            )
        if not 1 <= frames <= 8:
            raise ConfigError(f"{env_id}: frames (observations stacked) is 1..8, not {frames}")
        if not 1 <= decision_steps <= 10:
            raise ConfigError(
                f"{env_id}: decision_steps (0.1 s simulator steps an action is held) is 1..10, "
                f"not {decision_steps}"
            )
        self.decision_steps = int(decision_steps)
        self.metadata = {**self.metadata, "render_fps": 10 / self.decision_steps}  # real time
        self.grid, self.grid_cell, self.frames = int(grid), float(grid_cell), int(frames)
        self.frame_dim = OBS_DIM + 2 * self.grid**2 + sc.signals
        self.num_envs = B = sc.num_envs
        self.max_episode_steps = int(max_episode_steps or 300)
        agents = tuple(f"agent_{i}" for i in range(AGENTS))
        obs = gym.spaces.Box(-np.inf, np.inf, (self.frame_dim * self.frames,), np.float32)
        action: gym.Space = (
            gym.spaces.Box(np.array([0, 0, -1], np.float32), np.array([1, 1, 1], np.float32))
            if sc.continuous
            else gym.spaces.Discrete(4)
        )
        self.groups = {GROUP: AgentGroup(GROUP, agents, obs, action)}
        self.state_space: gym.Space | None = gym.spaces.Box(
            -np.inf, np.inf, (sc.slots * 6 + 4 * sc.signals,), np.float32
        )
        self.done = np.zeros((B, AGENTS), bool)
        self.outcome = np.zeros((B, AGENTS), np.int64)
        """How each agent's episode went so far: 0 driving, 1 completed, 2 collided, 3 off
        the road (`episode_info`)."""
        self.finish_time = np.full((B, AGENTS), np.nan)
        self.t = np.zeros(B, np.int64)
        self.signal_offset = np.zeros(B)
        """Where in the signal cycle (seconds) each env's episode began."""
        self._frames = np.zeros((B, AGENTS, self.frames, self.frame_dim), np.float32)
        self._frame_t = np.full(B, -1, np.int64)
        """The stacked observations and the step ``t`` of the newest (`frames`)."""
        self._needs_reset = np.zeros(B, bool)
        self._started = False
        self.rng = np.random.default_rng(seed)
        self.tracker = EpisodeTracker(B, self.groups)
        self.vehicles = Vehicles(sc)
        self.sim = make_simulator(backend, self.vehicles, self.rng, simulator_options)

    # ----------------------------------------------------------------- protocol

    def step(self, actions: dict[str, np.ndarray]) -> MultiAgentStep:
        if not self._started:
            self.reset()
        resetting = self._needs_reset.copy()
        real = ~resetting
        acting = ~self.done & real[:, None]
        reward = np.zeros(acting.shape)
        finished = np.zeros_like(acting)
        for _ in range(self.decision_steps):  # the action is held; rewards add up
            running = real & ~self.done.all(axis=1) & (self.t < self.max_episode_steps)
            moved, ended_now = self._advance(np.asarray(actions[GROUP]), running)
            reward += moved
            finished |= ended_now
        reward = np.where(acting, reward, 0.0).astype(np.float32)
        all_done = self.done.all(axis=1) & real
        timeout = real & (self.t >= self.max_episode_steps) & ~all_done
        truncated = timeout[:, None] & acting & ~finished
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

    def _advance(self, actions: np.ndarray, running: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One simulator step (`Scenario.dt`) of the ``running`` envs (not resetting, not
        ended): move the vehicles, judge the agents still driving, let traffic enter. Returns
        each agent's reward of this step and whether it finished in it, ``[B, 4]``."""
        sc, v, A = self.scenario, self.vehicles, AGENTS
        acting = ~self.done & running[:, None]
        s_before = v.s[:, :A].copy()
        lights = self.lights()
        self.sim.move(actions, acting, running, lights)
        v.project()
        s_now = v.s_now
        v.s[:, :A] = np.where(acting, s_now, s_before)
        collided = self.sim.collisions() & acting
        length = sc.routes.length[v.route[:, :A]]
        completed = (s_now >= length - 3.0) & acting & ~collided
        off_road = (np.abs(v.lateral) > 2 * sc.layout.lane_width) & acting & ~collided & ~completed
        reward = self.progress_weight * (s_now - s_before)
        reward += self.completion_bonus * completed - self.collision_penalty * collided
        reward -= self.off_road_penalty * off_road
        if sc.signals:  # entered the box this step while its light was red
            stop = sc.layout.arm_length
            red = np.take_along_axis(lights, sc.route_arm[v.route[:, :A]], 1) == 0
            crossed = (s_before < stop) & (s_now >= stop) & acting & red
            reward -= self.red_light_penalty * crossed
        finished = collided | completed | off_road
        self.outcome = np.where(
            completed, 1, np.where(collided, 2, np.where(off_road, 3, self.outcome))
        )
        self.finish_time = np.where(completed, (self.t + 1)[:, None] * sc.dt, self.finish_time)
        self.done |= finished
        v.present[:, :A] &= ~self.done  # done agents leave the road
        self.t += running
        self.sim.enter(running, self.rng)
        return np.where(acting, reward, 0.0), finished

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

    def _reset_envs(self, envs: np.ndarray) -> None:
        """New episodes in ``envs``: every vehicle off the road, the agents at their start
        on routes drawn now, a new point of the signal cycle; then the simulator's reset."""
        sc, v, k = self.scenario, self.vehicles, envs.size
        v.present[envs] = False
        for i in range(AGENTS):
            route = sc.agent_routes(i, k, self.rng)
            v.place(envs, np.full(k, i), route, np.full(k, START_S), START_SPEED, fresh=False)
        v.steer[envs] = 0.0
        v.target_offset[envs] = 0.0
        self.done[envs] = False
        self.outcome[envs] = 0
        self.finish_time[envs] = np.nan
        self.t[envs] = 0
        if sc.signals:
            self.signal_offset[envs] = self.rng.uniform(0.0, sc.cycle_s, k)
        v.project(envs)
        self.sim.reset(envs)

    def lights(self) -> np.ndarray:
        """``[B, 4]``: each arm's light now, 0 red, 1 yellow, 2 green (all green without
        ``signals``)."""
        return self.scenario.lights(self.signal_offset, self.t)

    def get_state(self) -> dict[str, Any]:
        """The env's, the vehicles' and the simulator's state (an external simulator's
        cannot be saved: `EnvStateUnsupported`)."""
        own = self.sim.get_state()
        state = super().get_state()
        state.update(
            {key: getattr(self.vehicles, name).copy() for key, name in VEHICLE_STATE.items()}
        )
        state.update(own)
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        for key, name in VEHICLE_STATE.items():
            getattr(self.vehicles, name)[:] = state[key]
        self.sim.set_state(state)
        super().set_state(state)

    def close(self) -> None:
        self.sim.close()

    # ----------------------------------------------------------------- observations

    def observe(self) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Each agent's observation (its frames stacked) and the global state."""
        sc, v = self.scenario, self.vehicles
        lights = self.lights()
        parts = [agent_features(v, self.neighbours, self.sensor_range, self.lookahead)]
        if self.grid:
            parts.append(occupancy(v, self.grid, self.grid_cell).reshape(self.num_envs, AGENTS, -1))
        if sc.signals:
            parts.append(
                np.take_along_axis(lights, sc.route_arm[v.route[:, :AGENTS]], 1)[..., None] / 2
            )
        obs = self._stack(np.concatenate(parts, -1).astype(np.float32))
        return {GROUP: obs}, global_state(v, lights if sc.signals else None)

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
        """A 480x480 RGB frame of env 0 (about 4 pixels a metre): roads grey, the learning
        agents in colour, each inside a white halo, the background traffic dark grey (and the
        traffic lights with signals)."""
        sc, v = self.scenario, self.vehicles
        road = 2 * sc.layout.lane_width

        def roads(frame: np.ndarray, xs: np.ndarray, ys: np.ndarray) -> None:
            frame[(np.abs(xs) <= road) | (np.abs(ys) <= road)] = (128, 128, 128)

        colours = [(220, 60, 60), (60, 120, 220), (230, 200, 40), (200, 90, 220)]
        discs = v.discs()[0]
        present = np.flatnonzero(v.present[0])
        halos = [(x, y, sc.disc_radius + 0.9, (255, 255, 255))
                 for i in present if i < AGENTS for x, y in discs[i]]  # fmt: skip
        cars = halos + [
            (x, y, sc.disc_radius, colours[i] if i < AGENTS else (40, 40, 40))
            for i in present
            for x, y in discs[i]
        ]
        if sc.signals:  # a light beside each arm's entry lanes, at the box's edge
            lamp = [(200, 30, 30), (240, 200, 30), (40, 200, 60)]
            h, w = sc.layout.half, sc.layout.lane_width
            for arm, light in enumerate(self.lights()[0]):
                angle = arm * np.pi / 2
                x, y = 2.6 * w, -h - 1.5  # south arm's kerb side, turned to the arm
                c, s = np.cos(angle), np.sin(angle)
                cars.append((c * x - s * y, s * x + c * y, 1.2, lamp[light]))
        extent = sc.layout.half + sc.layout.arm_length
        return disc_frame(cars, 480, extent, background=(96, 160, 96), paint=roads)


def make_intersection(config: EnvConfig) -> IntersectionEnv:
    """``shoal/intersection-v0`` on the simulator ``env.kwargs["backend"]`` names: builtin
    (the default), sumo or smarts (`shoal.envs.intersection.simulators`)."""
    return factory(IntersectionEnv)(config)


def make_smarts_intersection(config: EnvConfig) -> IntersectionEnv:
    """``shoal/smarts-intersection-v0``: the intersection on the SMARTS backend."""
    kwargs = {**config.kwargs, "backend": "smarts", "env_id": SMARTS_ID}
    return factory(IntersectionEnv)(dataclasses.replace(config, kwargs=kwargs))


register_multi_agent_env(ENV_ID, make_intersection)
register_multi_agent_env(SMARTS_ID, make_smarts_intersection)
