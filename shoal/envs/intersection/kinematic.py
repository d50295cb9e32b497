"""The built-in simulator of the intersection: vehicles moved by kinematic models, batched
over ``[num_envs, ...]``.

* **Agents** (`shoal.envs.intersection.driving.AgentDriver`) move by the kinematic bicycle
  model at 0.1 s steps. With discrete actions (the paper's lane-following controls: 0 keep
  lane, 1 slow down, 2 change right, 3 change left) a Stanley steering law (Thrun et al.
  2006) tracks the route's centreline shifted by the chosen lane offset, and the speed goes
  toward 10 m/s (keep lane) or brakes at 4 m/s^2 (slow down); lane changes shift the target
  by one lane within the road. With continuous actions ``(throttle, brake, steering)`` in
  ``[0, 1] x [0, 1] x [-1, 1]``: acceleration ``2 throttle - 6 brake`` m/s^2 and steering
  ``0.6 steering`` rad.
* **Background vehicles** follow their routes exactly under IDM; their leader is the closest
  vehicle ahead within 2.5 m of their heading line (the car in their lane, or one crossing
  their path in the box), which makes them yield; with signals, a red light (or a yellow one
  they can stop for at 3 m/s^2) is a standing leader at their stop line. They leave at their
  route's end.
* **Arrivals** (`shoal.envs.intersection.driving.Arrivals`): background vehicles enter the
  arms' ends at the scenario's rate over the eight entry lanes, when the entry is clear and
  a slot is free. The SUMO backend uses the same arrival process.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from shoal.envs.intersection.driving import AgentDriver, Arrivals
from shoal.envs.intersection.dynamics import clip, idm_acceleration
from shoal.envs.intersection.geometry import point_at
from shoal.envs.intersection.scenario import AGENTS
from shoal.envs.intersection.vehicles import Vehicles


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
