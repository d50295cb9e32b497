"""``shoal/smarts-intersection-v0``: the intersection of ``shoal/intersection-v0`` in SMARTS
(Zhou et al. 2020, "SMARTS: Scalable Multi-Agent Reinforcement Learning Training School for
Autonomous Driving"), the simulator Biswas and Biswas trained in. Extra ``shoal[smarts]``.

**What it is for.** Checking results of the built-in simulator in the paper's own simulator
and running SMARTS scenarios with shoal's learners. It is slow: SMARTS steps its physics
(Bullet) and SUMO's traffic over TraCI at about 30-50 env steps/s on one core, thousands of
times slower than the built-in intersection; train on ``shoal/intersection-v0`` and evaluate
here.

**Scenario.** shoal writes it once (cached under ``~/.cache/shoal/smarts``): the network the
SUMO backend builds with netconvert (`shoal.envs.intersection.network.build_network`) as
``map.net.xml``, background flows of SMARTS's default car on every entry lane and allowed
turn at ``traffic`` vehicles per minute in all (``low`` 10, ``high`` 30, or a number), and no
Via points. At each reset the four agents get missions of their own: a start 15 m into arm
``i`` on a route drawn as in the built-in env (``routes random|fixed``), and a goal within 3 m
of the route's end.

**Agents.** ``continuous=False``: SMARTS's lane-following (Laner) interface, the paper's
actions 0 keep lane, 1 slow down, 2 change lane right, 3 change lane left. ``continuous=True``:
``(throttle, brake, steering)`` in ``[0, 1] x [0, 1] x [-1, 1]``.

**Observations, rewards, metrics** are the built-in env's, computed from SMARTS's vehicle
states (agents' and the neighbours SMARTS reports within 50 m), so policies move between the
simulators: the same 48 observations, progress, completion and off-road definitions, with
collisions as SMARTS's physics reports them (the occupancy grid option works here too; the
signals do not: the SMARTS scenario has no traffic lights). Envs step one after another in
this process; SMARTS's state cannot be saved, so runs restart episodes on resume.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import shutil
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from shoal.core.errors import ConfigError
from shoal.envs.intersection.external import build_once, cache_dir, route_edges, unsaved_state
from shoal.envs.intersection.geometry import point_at
from shoal.envs.intersection.network import build_network
from shoal.envs.intersection.scenario import AGENTS, Scenario
from shoal.envs.intersection.vehicles import Vehicles

INSTALL = "pip install 'shoal[smarts]'"
LANE_ACTIONS = ("keep_lane", "slow_down", "change_lane_right", "change_lane_left")
"""SMARTS's lane actions, in the order of the built-in env's discrete actions."""
SENSOR_RANGE = 50.0
"""Metres around an agent within which SMARTS reports its neighbours (the observation's)."""


@contextlib.contextmanager
def process_streams() -> Iterator[None]:
    """SMARTS silences pybullet's and SUMO's banners through the file descriptors of
    ``sys.stdout`` and ``sys.stderr``, which notebooks and captured test output replace: it
    is imported, built and stepped with the process's own streams."""
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
    try:
        yield
    finally:
        sys.stdout, sys.stderr = streams


def require_smarts() -> None:
    """Import SMARTS's simulator, or a `ConfigError` naming the install command."""
    if importlib.util.find_spec("smarts") is None:
        raise ConfigError(f"shoal/smarts-intersection-v0 needs SMARTS: {INSTALL}")
    # SMARTS 2.0.1 calls libsumo/traci's moveToXY with a keyword SUMO 1.28 renamed, every step.
    warnings.filterwarnings("ignore", "Use of deprecated parameter lane", UserWarning)
    with process_streams():
        import smarts.core.smarts  # noqa: F401


def write_scenario(scenario: Scenario) -> Path:
    """The SMARTS scenario directory for the scenario's traffic (built once per content)."""
    from smarts.sstudio import gen_scenario
    from smarts.sstudio import sstypes as t

    net, _ = build_network(scenario)
    per_hour = scenario.vehicles_per_minute * 60.0 / len(scenario.entry_routes)
    keys = scenario.routes.keys
    flows: list[Any] = []
    for key in keys:
        turns = sum(1 for other in keys if other[:2] == key[:2])
        entry, exit_, sumo_lane = route_edges(key)
        route = t.Route(begin=(entry, sumo_lane, 0), end=(exit_, sumo_lane, "max"))
        if per_hour > 0:
            flows.append(t.Flow(route=route, rate=per_hour / turns,
                                actors={t.TrafficActor("car"): 1.0}))  # fmt: skip
    digest = hashlib.sha256(net.read_bytes() + repr(flows).encode()).hexdigest()[:16]

    def make(work: Path) -> None:
        shutil.copy(net, work / "map.net.xml")
        traffic = {"background": t.Traffic(flows=flows)} if flows else None
        gen_scenario(t.Scenario(traffic=traffic), output_dir=str(work))

    return build_once(cache_dir("smarts") / digest, make)


class SmartsSimulator:
    """The intersection's vehicles moved by SMARTS, one SMARTS simulation per env (a
    `shoal.envs.intersection.simulators.Simulator`); ``headless`` False opens SUMO's GUI."""

    name = "SMARTS"

    def __init__(self, vehicles: Vehicles, rng: np.random.Generator, headless: bool = True):
        require_smarts()
        sc = vehicles.scenario
        if sc.signals:
            raise ConfigError(f"{sc.env_id}: the 'signals' option is built-in only")
        from smarts.core.agent_interface import (
            ActionSpaceType,
            AgentInterface,
            DoneCriteria,
            NeighborhoodVehicles,
        )
        from smarts.core.scenario import Scenario as SmartsScenario
        from smarts.core.smarts import SMARTS
        from smarts.core.sumo_traffic_simulation import SumoTrafficSimulation

        self.vehicles, self.scenario = vehicles, sc
        self.agent_ids = [f"agent_{i}" for i in range(AGENTS)]
        action = ActionSpaceType.Continuous if sc.continuous else ActionSpaceType.Lane
        interface = AgentInterface(
            action=action,
            neighborhood_vehicle_states=NeighborhoodVehicles(radius=SENSOR_RANGE),
            done_criteria=DoneCriteria(off_route=False),  # shoal decides off the road
        )
        interfaces = {agent: interface for agent in self.agent_ids}
        directory = write_scenario(sc)
        self._scenario = next(SmartsScenario.scenario_variations([str(directory)], self.agent_ids))
        with process_streams():
            self._sims = [
                SMARTS(interfaces, traffic_sims=[SumoTrafficSimulation(headless=headless)])
                for _ in range(sc.num_envs)
            ]
        self._live: list[set[str]] = [set() for _ in range(sc.num_envs)]
        self._collided = np.zeros((sc.num_envs, AGENTS), bool)

    def reset(self, envs: np.ndarray) -> None:
        """SMARTS missions for the agents the env placed: a start 2 m ahead of their centre
        (SMARTS places the front bumper) and a goal within 3 m of their route's end."""
        from smarts.core.coordinates import Heading, Point
        from smarts.core.plan import NavigationMission, PositionalGoal, Start

        v, routes = self.vehicles, self.scenario.routes
        for b in envs:
            missions = {}
            for i, agent in enumerate(self.agent_ids):
                route = v.route[b, i : i + 1]
                front, heading = point_at(routes, route, v.s[b, i : i + 1] + 2.0)
                end, _ = point_at(routes, route, routes.length[route])
                missions[agent] = NavigationMission(  # SMARTS's headings: 0 is north
                    start=Start(front[0], Heading(float(heading[0]) - np.pi / 2)),
                    goal=PositionalGoal(Point(float(end[0, 0]), float(end[0, 1])), radius=3.0),
                )
            self._scenario.set_ego_missions(missions)
            with process_streams():
                observations = self._sims[b].reset(self._scenario)
            self._live[b] = set(observations)
            self._read(b, observations)
        self._collided[envs] = False

    def move(
        self, actions: np.ndarray, acting: np.ndarray, real: np.ndarray, lights: np.ndarray
    ) -> None:
        """One SMARTS step per ``real`` env (SMARTS's flows bring the background traffic;
        agents that are done slow down until SMARTS takes them off)."""
        sc = self.scenario
        B, A = sc.num_envs, AGENTS
        if sc.continuous:
            a = np.clip(actions.reshape(B, A, 3), [0, 0, -1], [1, 1, 1])
        else:
            a = actions.reshape(B, A).astype(np.int64)
        for b in np.flatnonzero(real).tolist():
            commands = {
                agent: (a[b, i].astype(np.float64) if sc.continuous
                        else LANE_ACTIONS[int(a[b, i])])
                if acting[b, i] else (np.zeros(3) if sc.continuous else "slow_down")
                for i, agent in enumerate(self.agent_ids)
                if agent in self._live[b]
            }  # fmt: skip
            with process_streams():
                observations, _, dones, _ = self._sims[b].step(commands)
            self._read(b, observations)
            self._live[b] = {a for a in observations if not dones.get(a, False)}

    def _read(self, b: int, observations: dict[str, Any]) -> None:
        """Env ``b``'s vehicles from SMARTS's observations: agents in their slots, the
        neighbours they see in the background slots (nearest first when too many)."""
        v, A = self.vehicles, AGENTS
        neighbours: dict[str, Any] = {}
        for i, agent in enumerate(self.agent_ids):
            obs = observations.get(agent)
            if obs is None:
                continue
            ego = obs.ego_vehicle_state
            v.pos[b, i] = ego.position[:2]
            v.heading[b, i] = float(ego.heading) + np.pi / 2
            v.speed[b, i] = ego.speed
            if ego.steering is not None and not np.isnan(ego.steering):
                v.steer[b, i] = float(ego.steering)
            self._collided[b, i] |= len(obs.events.collisions) > 0
            if obs.events.reached_goal:  # SMARTS takes it off at its goal: it completed
                v.park_at_route_end(b, i)
            for vehicle in obs.neighborhood_vehicle_states or ():
                if not vehicle.id.startswith("Agent"):
                    neighbours[vehicle.id] = vehicle
        v.present[b, A:] = False
        own = v.pos[b, :A][v.present[b, :A]]
        ranked = sorted(
            neighbours.values(),
            key=lambda n: np.min(np.linalg.norm(own - n.position[:2], axis=1)) if len(own) else 0,
        )
        for slot, vehicle in zip(range(A, self.scenario.slots), ranked, strict=False):
            v.pos[b, slot] = vehicle.position[:2]
            v.heading[b, slot] = float(vehicle.heading) + np.pi / 2
            v.speed[b, slot] = vehicle.speed
            v.present[b, slot] = True

    def collisions(self) -> np.ndarray:
        """Collisions as SMARTS's physics reports them."""
        return self._collided & self.vehicles.present[:, :AGENTS]

    def enter(self, real: np.ndarray, rng: np.random.Generator) -> None:
        """SMARTS's flows bring the background traffic."""

    def get_state(self) -> dict[str, Any]:
        raise unsaved_state(self.name)

    def set_state(self, state: dict[str, Any]) -> None:
        raise unsaved_state(self.name)

    def close(self) -> None:
        for sim in self._sims:
            sim.destroy()
        self._sims = []
