"""The built-in simulator of the intersection: vehicles moved by kinematic models, batched
over ``[num_envs, ...]``.

* **Agents** (`AgentDriver`) move by the kinematic bicycle model at 0.1 s steps. With
  discrete actions (the paper's lane-following controls: 0 keep lane, 1 slow down, 2 change
  right, 3 change left) a Stanley steering law (Thrun et al. 2006) tracks the route's
  centreline shifted by the chosen lane offset, and the speed goes toward 10 m/s (keep lane)
  or brakes at 4 m/s^2 (slow down); lane changes shift the target by one lane within the road.
  With continuous actions ``(throttle, brake, steering)`` in ``[0, 1] x [0, 1] x [-1, 1]``:
  acceleration ``2 throttle - 6 brake`` m/s^2 and steering ``0.6 steering`` rad.
* **Background vehicles** follow their routes exactly under IDM; their leader is the closest
  vehicle ahead within 2.5 m of their heading line (the car in their lane, or one crossing
  their path in the box), which makes them yield; with signals, a red light (or a yellow one
  they can stop for at 3 m/s^2) is a standing leader at their stop line. They leave at their
  route's end.
* **Arrivals** (`Arrivals`): background vehicles enter the arms' ends at the scenario's
  rate over the eight entry lanes, when the entry is clear and a slot is free. The SUMO
  backend uses the same arrival process.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from shoal.envs.intersection.dynamics import bicycle_step, clip, idm_acceleration, wrap_angle
from shoal.envs.intersection.geometry import point_at
from shoal.envs.intersection.scenario import AGENTS, START_SPEED, Scenario
from shoal.envs.intersection.vehicles import Vehicles

BRAKE = 4.0
"""The agents' braking (m/s^2) on "slow down"."""
STANLEY_GAIN = 1.0
MAX_STEER = 0.6
"""Steering limit (rad)."""


def lane_accel(scenario: Scenario, actions: np.ndarray, speed: np.ndarray) -> np.ndarray:
    """The discrete actions' acceleration: toward the cruising speed at +2/-3 m/s^2, or
    braking at `BRAKE` (slow down, action 1)."""
    return np.where(actions == 1, -BRAKE, clip(scenario.target_speed - speed, -3.0, 2.0))


class AgentDriver:
    """The agents' controls on the kinematic bicycle model (see the module docstring); lane
    changes move the agents' `Vehicles.target_offset`."""

    def __init__(self, vehicles: Vehicles):
        self.vehicles = vehicles
        self.scenario = vehicles.scenario

    def drive(self, actions: np.ndarray, acting: np.ndarray) -> None:
        """Move the ``acting`` agents one step by ``actions`` (``[B, A]`` or ``[B, A, 3]``)."""
        sc, v = self.scenario, self.vehicles
        B, A = sc.num_envs, AGENTS
        speed, heading = v.speed[:, :A], v.heading[:, :A]
        if sc.continuous:
            a = clip(actions.reshape(B, A, 3), [0, 0, -1], [1, 1, 1])
            accel = 2.0 * a[..., 0] - 6.0 * a[..., 1]
            steer = MAX_STEER * a[..., 2]
        else:
            a = actions.reshape(B, A).astype(np.int64)
            w = sc.layout.lane_width
            own_lane = sc.route_lane[v.route[:, :A]]  # 0: left lane (may go right)
            low, high = np.where(own_lane == 0, -w, 0.0), np.where(own_lane == 0, 0.0, w)
            shift = np.where(a == 2, -w, np.where(a == 3, w, 0.0))
            offset = np.where(acting, clip(v.target_offset + shift, low, high), v.target_offset)
            v.target_offset = offset
            accel = lane_accel(sc, a, speed)
            cross = np.arctan(STANLEY_GAIN * (v.lateral - offset) / (speed + 1.0))
            steer = wrap_angle(v.path_heading - heading) - cross
        x, y, h, s = bicycle_step(
            v.pos[:, :A, 0], v.pos[:, :A, 1], heading, speed, accel, steer, sc.dt
        )
        keep = ~acting
        v.pos[:, :A, 0] = np.where(keep, v.pos[:, :A, 0], x)
        v.pos[:, :A, 1] = np.where(keep, v.pos[:, :A, 1], y)
        v.heading[:, :A] = np.where(keep, heading, h)
        v.speed[:, :A] = np.where(keep, speed, s)
        v.steer = np.where(keep, v.steer, clip(steer, -MAX_STEER, MAX_STEER))


class Arrivals:
    """Background vehicles entering at the scenario's rate (see the module docstring)."""

    def __init__(self, vehicles: Vehicles):
        self.vehicles = vehicles
        self.scenario = vehicles.scenario

    def enter(
        self, real: np.ndarray, rng: np.random.Generator
    ) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Place this step's arrivals in the ``real`` envs; returns them as ``(envs, slots,
        routes)`` per entry lane, at arc length 0 and `START_SPEED`."""
        sc, v = self.scenario, self.vehicles
        if sc.vehicles_per_minute <= 0 or sc.slots == AGENTS:
            return []
        entries = sc.entry_routes
        chance = sc.vehicles_per_minute / 60.0 * sc.dt / len(entries)
        draws = rng.random((sc.num_envs, len(entries)))
        arrivals = (draws < chance) & real[:, None]
        placed = []
        for e in np.flatnonzero(arrivals.any(axis=0)):
            envs = np.flatnonzero(arrivals[:, e])
            gap = v.pos[envs] - sc.entry_points[e]
            clear = ~((np.sqrt((gap * gap).sum(-1)) < 10.0) & v.present[envs]).any(1)
            free = ~v.present[envs, AGENTS:]
            envs, free = envs[clear & free.any(1)], free[clear & free.any(1)]
            if not envs.size:
                continue
            slots = AGENTS + np.argmax(free, axis=1)
            route = np.array(entries[e])[rng.integers(len(entries[e]), size=envs.size)]
            v.place(envs, slots, route, np.zeros(envs.size), START_SPEED)
            placed.append((envs, slots, route))
        return placed


class KinematicSimulator:
    """The built-in `shoal.envs.intersection.simulators.Simulator`: `AgentDriver` for the
    agents, IDM for the background vehicles, `Arrivals` for new ones. Its whole state is the
    vehicle arrays, so runs on it save and resume exactly."""

    name = "built-in"

    def __init__(self, vehicles: Vehicles, rng: np.random.Generator):
        self.vehicles = vehicles
        self.scenario = vehicles.scenario
        self.driver = AgentDriver(vehicles)
        self.arrivals = Arrivals(vehicles)

    def reset(self, envs: np.ndarray) -> None:
        """The agents start where the env put them."""

    def move(
        self, actions: np.ndarray, acting: np.ndarray, real: np.ndarray, lights: np.ndarray
    ) -> None:
        self.driver.drive(actions, acting)
        self._drive_background(real, lights)

    def enter(self, real: np.ndarray, rng: np.random.Generator) -> None:
        self.arrivals.enter(real, rng)

    def collisions(self) -> np.ndarray:
        return self.vehicles.collisions()

    def get_state(self) -> dict[str, Any]:
        return {}

    def set_state(self, state: dict[str, Any]) -> None:
        """Nothing beside the vehicle arrays."""

    def close(self) -> None:
        pass

    def _drive_background(self, real: np.ndarray, lights: np.ndarray) -> None:
        sc, v, A = self.scenario, self.vehicles, AGENTS
        moving = v.present[:, A:] & real[:, None]
        if not moving.any():
            return
        c, s = np.cos(v.heading[:, A:]), np.sin(v.heading[:, A:])
        rel = v.pos[:, None, :, :] - v.pos[:, A:, None, :]  # [B, M, V, 2]
        ahead = c[..., None] * rel[..., 0] + s[..., None] * rel[..., 1]
        side = -s[..., None] * rel[..., 0] + c[..., None] * rel[..., 1]
        blocking = v.present[:, None, :] & (ahead > 0.1) & (np.abs(side) < 2.5)
        gap_to = np.where(blocking, ahead, np.inf)
        leader = np.argmin(gap_to, axis=2)
        gap = np.take_along_axis(gap_to, leader[..., None], 2)[..., 0] - 2 * sc.disc_offset - 2.0
        lead_speed = np.take_along_axis(v.speed, leader, 1)
        if sc.signals:  # a red light, or a yellow one it can stop for, stands at the line
            light = np.take_along_axis(lights, sc.route_arm[v.route[:, A:]], 1)
            to_line = sc.layout.arm_length - v.s[:, A:] - sc.disc_offset - sc.disc_radius
            can_stop = v.speed[:, A:] ** 2 / 6.0 <= to_line
            stop = (to_line > -0.5) & ((light == 0) | ((light == 1) & can_stop)) & (to_line < gap)
            gap = np.where(stop, to_line, gap)
            lead_speed = np.where(stop, 0.0, lead_speed)
        approach = np.where(np.isinf(gap), 0.0, v.speed[:, A:] - lead_speed)
        accel = idm_acceleration(v.speed[:, A:], gap, approach, sc.idm)
        speed = clip(v.speed[:, A:] + accel * sc.dt, 0.0, sc.target_speed * 1.2)
        s_new = v.s[:, A:] + speed * sc.dt
        routes = v.route[:, A:]
        point, heading = point_at(sc.routes, routes.reshape(-1), s_new.reshape(-1))
        shape = routes.shape
        v.speed[:, A:] = np.where(moving, speed, v.speed[:, A:])
        v.s[:, A:] = np.where(moving, s_new, v.s[:, A:])
        v.pos[:, A:] = np.where(moving[..., None], point.reshape(*shape, 2), v.pos[:, A:])
        v.heading[:, A:] = np.where(moving, heading.reshape(shape), v.heading[:, A:])
        arrived = moving & (s_new >= sc.routes.length[routes] - 0.5)
        v.present[:, A:] &= ~arrived
