"""``shoal/smarts-intersection-v0``: the intersection of ``shoal/intersection-v0`` in SMARTS
(Zhou et al. 2020, "SMARTS: Scalable Multi-Agent Reinforcement Learning Training School for
Autonomous Driving"), the simulator Biswas and Biswas trained in. Extra ``shoal[smarts]``.

**What it is for.** Checking results of the built-in simulator in the paper's own simulator
and running SMARTS scenarios with shoal's learners. It is slow: SMARTS steps its physics
(Bullet) and SUMO's traffic over TraCI at about 30-50 env steps/s on one core, thousands of
times slower than the built-in intersection; train on ``shoal/intersection-v0`` and evaluate
here.

**Scenario.** shoal writes it once (cached under ``~/.cache/shoal/smarts``): the network the
SUMO backend builds with netconvert (`shoal.envs.intersection.sumo.build_network`) as
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
collisions as SMARTS's physics reports them. Envs step one after another in this process;
SMARTS's state cannot be saved, so runs restart episodes on resume.
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

from shoal.envs.batched import factory
from shoal.envs.intersection.env import AGENTS, IntersectionEnv
from shoal.envs.intersection.external import (
    ExternalSimulator,
    build_once,
    cache_dir,
    route_edges,
)
from shoal.envs.intersection.geometry import point_at
from shoal.envs.intersection.sumo import build_network
from shoal.envs.multi_agent import register_multi_agent_env
from shoal.errors import ConfigError

INSTALL = "pip install 'shoal[smarts]'"
LANE_ACTIONS = ("keep_lane", "slow_down", "change_lane_right", "change_lane_left")
"""SMARTS's lane actions, in the order of the built-in env's discrete actions."""


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


def write_scenario(env: IntersectionEnv) -> Path:
    """The SMARTS scenario directory for ``env``'s traffic (built once per content)."""
    from smarts.sstudio import gen_scenario
    from smarts.sstudio import sstypes as t

    net, _ = build_network(env)
    per_hour = env.vehicles_per_minute * 60.0 / len(env._entry_routes)
    flows = []
    for key in env.routes.keys:
        turns = sum(1 for other in env.routes.keys if other[:2] == key[:2])
        entry, exit_, sumo_lane = route_edges(key)
        route = t.Route(begin=(entry, sumo_lane, 0), end=(exit_, sumo_lane, "max"))
        if per_hour > 0:
            flows.append(t.Flow(route=route, rate=per_hour / turns,
                                actors={t.TrafficActor("car"): 1.0}))  # fmt: skip
    key = hashlib.sha256(net.read_bytes() + repr(flows).encode()).hexdigest()[:16]

    def make(work: Path) -> None:
        shutil.copy(net, work / "map.net.xml")
        traffic = {"background": t.Traffic(flows=flows)} if flows else None
        gen_scenario(t.Scenario(traffic=traffic), output_dir=str(work))

    return build_once(cache_dir("smarts") / key, make)


class SmartsIntersectionEnv(ExternalSimulator):
    """`IntersectionEnv` with SMARTS moving the vehicles, one SMARTS simulation per env."""

    simulator = "SMARTS"

    env_id = "shoal/smarts-intersection-v0"

    def __init__(self, num_envs: int = 1, *, headless: bool = True, **kwargs: Any):
        require_smarts()
        for option in ("grid", "signals"):
            if kwargs.get(option):
                raise ConfigError(f"{self.env_id}: the {option!r} option is built-in only")
        super().__init__(num_envs, **kwargs)
        from smarts.core.agent_interface import (
            ActionSpaceType,
            AgentInterface,
            DoneCriteria,
            NeighborhoodVehicles,
        )
        from smarts.core.scenario import Scenario
        from smarts.core.smarts import SMARTS
        from smarts.core.sumo_traffic_simulation import SumoTrafficSimulation

        self.agent_ids = list(self.groups["agent"].agents)
        action = ActionSpaceType.Continuous if self.continuous else ActionSpaceType.Lane
        interface = AgentInterface(
            action=action,
            neighborhood_vehicle_states=NeighborhoodVehicles(radius=self.sensor_range),
            done_criteria=DoneCriteria(off_route=False),  # shoal decides off the road
        )
        interfaces = {agent: interface for agent in self.agent_ids}
        directory = write_scenario(self)
        self._scenario = next(Scenario.scenario_variations([str(directory)], self.agent_ids))
        with process_streams():
            self._sims = [
                SMARTS(interfaces, traffic_sims=[SumoTrafficSimulation(headless=headless)])
                for _ in range(self.num_envs)
            ]
        self._live: list[set[str]] = [set() for _ in range(self.num_envs)]
        self._actions: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        self._collided = np.zeros((self.num_envs, AGENTS), bool)

    # SMARTS missions and steps in place of the built-in vehicle motion.

    def _reset_envs(self, envs: np.ndarray) -> None:
        from smarts.core.coordinates import Heading, Point
        from smarts.core.plan import NavigationMission, PositionalGoal, Start

        super()._reset_envs(envs)  # routes and start poses, as the built-in env draws them
        for b in envs:
            missions = {}
            for i, agent in enumerate(self.agent_ids):
                route = self.route[b, i : i + 1]
                front, heading = point_at(self.routes, route, self.s[b, i : i + 1] + 2.0)
                end, _ = point_at(self.routes, route, self.routes.length[route])
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

    def _drive_agents(self, actions: np.ndarray, acting: np.ndarray) -> None:
        B, A = self.num_envs, AGENTS
        if self.continuous:
            a = np.clip(actions.reshape(B, A, 3), [0, 0, -1], [1, 1, 1])
        else:
            a = actions.reshape(B, A).astype(np.int64)
        for b in range(B):
            self._actions[b] = {
                agent: (a[b, i].astype(np.float64) if self.continuous
                        else LANE_ACTIONS[int(a[b, i])])
                if acting[b, i] else (np.zeros(3) if self.continuous else "slow_down")
                for i, agent in enumerate(self.agent_ids)
                if agent in self._live[b]
            }  # fmt: skip

    def _drive_background(self, real: np.ndarray) -> None:
        for b in np.flatnonzero(real):
            with process_streams():
                observations, _, dones, _ = self._sims[b].step(self._actions[b])
            self._read(b, observations)
            self._live[b] = {a for a in observations if not dones.get(a, False)}

    def _read(self, b: int, observations: dict[str, Any]) -> None:
        """Env ``b``'s vehicles from SMARTS's observations: agents in their slots, the
        neighbours they see in the background slots (nearest first when too many)."""
        A = AGENTS
        neighbours: dict[str, Any] = {}
        for i, agent in enumerate(self.agent_ids):
            obs = observations.get(agent)
            if obs is None:
                continue
            ego = obs.ego_vehicle_state
            self.pos[b, i] = ego.position[:2]
            self.heading[b, i] = float(ego.heading) + np.pi / 2
            self.speed[b, i] = ego.speed
            if ego.steering is not None and not np.isnan(ego.steering):
                self.steer[b, i] = float(ego.steering)
            self._collided[b, i] |= len(obs.events.collisions) > 0
            if obs.events.reached_goal:  # SMARTS takes it off at its goal: it completed
                self._finished_route(b, i)
            for vehicle in obs.neighborhood_vehicle_states or ():
                if not vehicle.id.startswith("Agent"):
                    neighbours[vehicle.id] = vehicle
        self.present[b, A:] = False
        own = self.pos[b, :A][self.present[b, :A]]
        ranked = sorted(
            neighbours.values(),
            key=lambda v: np.min(np.linalg.norm(own - v.position[:2], axis=1)) if len(own) else 0,
        )
        for slot, vehicle in zip(range(A, self.V), ranked, strict=False):
            self.pos[b, slot] = vehicle.position[:2]
            self.heading[b, slot] = float(vehicle.heading) + np.pi / 2
            self.speed[b, slot] = vehicle.speed
            self.present[b, slot] = True

    def _spawn(self, real: np.ndarray) -> None:
        """SMARTS's flows bring the background traffic."""

    def _collisions(self) -> np.ndarray:
        return self._collided & self.present[:, :AGENTS]

    def close(self) -> None:
        for sim in self._sims:
            sim.destroy()
        self._sims = []


def make_smarts_intersection(config) -> SmartsIntersectionEnv:
    require_smarts()
    return factory(SmartsIntersectionEnv)(config)


register_multi_agent_env(SmartsIntersectionEnv.env_id, make_smarts_intersection)
