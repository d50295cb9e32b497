"""What every simulator backend of the intersection drives with: the agents' driver
(`AgentDriver`: the kinematic bicycle model with the lane-following controls, a Stanley
steering law (Thrun et al. 2006, "Stanley: the robot that won the DARPA Grand Challenge")
and the discrete actions' accelerations, `lane_accel`) and the arrival process of the
background traffic (`Arrivals`). The built-in simulator moves the background vehicles
itself; SUMO moves them, with the same arrivals and, for continuous actions, the same
agents' driver."""

from __future__ import annotations

import numpy as np

from shoal.envs.intersection.dynamics import bicycle_step, clip, wrap_angle
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
