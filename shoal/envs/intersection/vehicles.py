"""The vehicles of a batch of intersections, as arrays ``[B, V]`` (agents in the first ``A``
slots): what a simulator writes each step and the environment reads to observe, reward and
judge the agents. Also the one definition of a vehicle's footprint (two discs) and of
collisions between footprints, and the agents' projection onto their routes."""

from __future__ import annotations

import numpy as np

from shoal.envs.intersection.geometry import point_at, project
from shoal.envs.intersection.scenario import AGENTS, Scenario


class Vehicles:
    """Every vehicle slot's route, pose, speed and presence, and the agents' steering and
    their projection onto their routes (`project`)."""

    def __init__(self, scenario: Scenario):
        B, V, A = scenario.num_envs, scenario.slots, AGENTS
        self.scenario = scenario
        self.route = np.zeros((B, V), np.int64)
        self.pos = np.zeros((B, V, 2))
        self.heading = np.zeros((B, V))
        self.speed = np.zeros((B, V))
        self.present = np.zeros((B, V), bool)
        self.s = np.zeros((B, V))
        """Arc length along the route (background vehicles; agents' last projection)."""
        self.steer = np.zeros((B, A))
        """The agents' steering angle (rad), as their simulator reports it."""
        self.target_offset = np.zeros((B, A))
        """The agents' target offset from their route's centreline (lane changes; 0 where
        the simulator keeps no lane target)."""
        self.s_now = np.zeros((B, A))
        self.lateral = np.zeros((B, A))
        self.path_heading = np.zeros((B, A))
        """The agents' arc length, signed lateral offset and route heading, as projected
        when they last moved (`project`)."""

    def place(
        self, envs: np.ndarray, slots: np.ndarray, route: np.ndarray, s, speed, fresh: bool = True
    ) -> None:
        """Put vehicles ``slots`` of ``envs`` on ``route`` at arc length ``s``, present;
        ``fresh``: project the agents among them now (a reset projects all four once)."""
        point, heading = point_at(self.scenario.routes, route, np.asarray(s, np.float64))
        self.route[envs, slots] = route
        self.pos[envs, slots] = point
        self.heading[envs, slots] = heading
        self.speed[envs, slots] = speed
        self.s[envs, slots] = s
        self.present[envs, slots] = True
        agents = slots < AGENTS
        if fresh and agents.any():
            self.project(np.unique(envs[agents]))

    def project(self, envs: np.ndarray | None = None) -> None:
        """Project the agents of ``envs`` (all by default) onto their routes, searching near
        their last arc length."""
        rows = slice(None) if envs is None else envs
        route = self.route[rows, :AGENTS]
        shape = route.shape
        s, d, h = project(
            self.scenario.routes,
            route.reshape(-1),
            self.pos[rows, :AGENTS].reshape(-1, 2),
            near=self.s[rows, :AGENTS].reshape(-1),
        )
        self.s_now[rows] = s.reshape(shape)
        self.lateral[rows] = d.reshape(shape)
        self.path_heading[rows] = h.reshape(shape)

    def park_at_route_end(self, b: int, i: int) -> None:
        """Put agent ``i`` of env ``b`` at its route's end: a simulator that takes a vehicle
        off at its destination (SUMO, SMARTS) leaves it there, so that the completion test
        sees it complete."""
        routes = self.scenario.routes
        route = self.route[b, i : i + 1]
        end, heading = point_at(routes, route, routes.length[route])
        self.pos[b, i], self.heading[b, i] = end[0], heading[0]

    def discs(self) -> np.ndarray:
        """``[B, V, 2, 2]``: the centres of each vehicle's rear and front disc."""
        offset = self.scenario.disc_offset
        direction = np.stack([np.cos(self.heading), np.sin(self.heading)], -1)
        return self.pos[:, :, None, :] + np.array([-1.0, 1.0])[None, None, :, None] * (
            offset * direction[:, :, None, :]
        )

    def collisions(self) -> np.ndarray:
        """``[B, A]``: an agent's discs overlap another present vehicle's."""
        A = AGENTS
        discs = self.discs()
        mine = discs[:, :A, None, :, None, :]  # [B, A, 1, 2, 1, 2]
        theirs = discs[:, None, :, None, :, :]  # [B, 1, V, 1, 2, 2]
        diff = mine - theirs
        gap2 = np.einsum("...k,...k->...", diff, diff).min(axis=(3, 4))  # [B, A, V], squared
        touching = (gap2 < (2 * self.scenario.disc_radius) ** 2) & self.present[:, None, :]
        touching[:, np.arange(A), np.arange(A)] = False
        return touching.any(axis=2) & self.present[:, :A]
