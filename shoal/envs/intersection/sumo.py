"""The SUMO backend of ``shoal/intersection-v0`` (``--env.kwargs backend sumo``): the same
scenario, spaces, rewards and metrics as the built-in simulator, with the vehicles driven by
Eclipse SUMO (Lopez et al. 2018, "Microscopic traffic simulation using SUMO") through libsumo.

* **Network.** ``netconvert`` builds it once (cached under ``~/.cache/shoal/sumo``) from the
  node, edge and connection files in ``shoal/envs/intersection/sumo/``: the built-in layout
  exactly (lanes 3.5 m wide, 1.75 and 5.25 m from the centre line, the box 24 m across with
  5 m kerb radii), the north-south road with priority over the east-west one; with
  ``signals=True`` the box has traffic lights, set every step to the built-in cycle's
  lights (left turns on green yield to oncoming traffic).
* **Background traffic.** SUMO's IDM (the built-in parameters: 10 m/s, 1.5 s headway, 2 m
  standstill gap, 1 and 1.5 m/s^2) with SUMO's junction model (minor-road vehicles yield).
  Vehicles arrive by the built-in arrival process (the same generator, rate and entry
  check, `shoal.envs.intersection.driving.Arrivals`) and enter with ``vehicle.add``.
* **Agents.** Discrete actions: SUMO moves them along their lanes at the speed the action
  asks for (keep lane: toward 10 m/s at +2/-3 m/s^2; slow down: -4 m/s^2), ignoring safe
  speeds and right of way (``speedMode 0``), and changes lanes on the entry arm of a
  straight route when asked (turns need their lane). Their steering observation is the
  bicycle-model angle of their yaw rate. Continuous actions: the built-in bicycle model
  moves them and SUMO places them (``moveToXY``) so its traffic reacts.
* **Collisions, completions, leaving the road, rewards** are the built-in definitions on
  SUMO's positions (SUMO's own collision checks are off).

Each env is one SUMO simulation in a worker process (`shoal.envs.intersection.sumo_worker`),
stepped in parallel; one env alone runs in-process. SUMO's state cannot be captured
exactly, so runs on this backend restart their episodes on resume (`EnvStateUnsupported`).
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from typing import Any

import numpy as np

from shoal.core.errors import ConfigError
from shoal.envs.intersection import sumo_worker
from shoal.envs.intersection.driving import MAX_STEER, AgentDriver, Arrivals, lane_accel
from shoal.envs.intersection.dynamics import clip, wrap_angle
from shoal.envs.intersection.external import route_edges, unsaved_state
from shoal.envs.intersection.geometry import TURNS
from shoal.envs.intersection.network import build_network
from shoal.envs.intersection.scenario import AGENTS
from shoal.envs.intersection.vehicles import Vehicles

_IN_PROCESS = {"taken": False}


class _Worker:
    """A `sumo_worker.Simulation` in a process of its own (``send`` then ``receive``)."""

    def __init__(self, arguments: dict[str, Any]) -> None:
        self.process = subprocess.Popen(
            [sys.executable, sumo_worker.__file__],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self.send(arguments)
        self.receive()

    def send(self, request: Any) -> None:
        assert self.process.stdin is not None  # opened with stdin=PIPE
        sumo_worker.write_message(self.process.stdin, request)

    def receive(self) -> Any:
        try:
            assert self.process.stdout is not None  # opened with stdout=PIPE
            answer = sumo_worker.read_message(self.process.stdout)
        except EOFError:
            raise RuntimeError(f"SUMO worker exited with code {self.process.wait()}") from None
        if isinstance(answer, Exception):
            raise answer
        return answer

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                self.send("close")
                self.process.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()


class _Local:
    """A `sumo_worker.Simulation` in this process (libsumo allows one per process)."""

    def __init__(self, arguments: dict[str, Any]) -> None:
        self.sim = sumo_worker.Simulation(**arguments)
        self.answer: Any = None

    def send(self, request: Any) -> None:
        self.answer = self.sim.step(request)

    def receive(self) -> Any:
        return self.answer

    def close(self) -> None:
        self.sim.close()
        _IN_PROCESS["taken"] = False


class SumoSimulator:
    """The intersection's vehicles moved by SUMO (a `shoal.envs.intersection.simulators.Simulator`);
    ``processes`` (default: one env alone runs in-process when no other SUMO simulation does)
    puts every env's simulation in a worker process."""

    name = "SUMO"

    def __init__(self, vehicles: Vehicles, rng: np.random.Generator, processes: bool | None = None):
        self.vehicles = vehicles
        self.scenario = sc = vehicles.scenario
        net, routes = build_network(sc)
        if processes is None:
            processes = sc.num_envs > 1 or _IN_PROCESS["taken"]
        if not processes and _IN_PROCESS["taken"]:
            raise ConfigError("libsumo runs one simulation per process: use processes=True")
        seeds = rng.integers(2**31 - 1, size=sc.num_envs)
        self._sims: list[_Worker | _Local] = []
        for b in range(sc.num_envs):
            arguments = dict(
                net=str(net), routes=str(routes), slots=sc.slots, agents=AGENTS,
                length=2 * (sc.disc_offset + sc.disc_radius), seed=int(seeds[b]),
                signals=sc.signals,
            )  # fmt: skip
            if processes:
                self._sims.append(_Worker(arguments))
            else:
                _IN_PROCESS["taken"] = True
                self._sims.append(_Local(arguments))
        self._requests: list[dict[str, Any]] = [{} for _ in range(sc.num_envs)]
        self.driver = AgentDriver(vehicles)  # continuous actions: the bicycle model moves them
        self.arrivals = Arrivals(vehicles)
        self._heading_before = np.zeros((sc.num_envs, AGENTS))

    def reset(self, envs: np.ndarray) -> None:
        """A new SUMO episode in each of ``envs``, with the agents on the road now (the first
        step moves them)."""
        v = self.vehicles
        for b in envs:
            add = [
                self._entry(b, i, v.route[b, i], v.s[b, i], v.speed[b, i]) for i in range(AGENTS)
            ]
            self._sims[b].send({"clear": True, "add": add, "advance": False})
        for b in envs:
            self._sims[b].receive()
            self._requests[b] = {}

    def move(
        self, actions: np.ndarray, acting: np.ndarray, real: np.ndarray, lights: np.ndarray
    ) -> None:
        """The agents' commands, then one SUMO step per ``real`` env."""
        self._command_agents(actions, acting)
        for b in np.flatnonzero(real):
            request = self._requests[b]
            request["remove"] = np.flatnonzero(~acting[b]).tolist()  # done agents leave
            if self.scenario.signals:
                request["lights"] = lights[b].tolist()
            self._sims[b].send(request)
        for b in np.flatnonzero(real):
            self._read(int(b), self._sims[b].receive(), acting[b])
            self._requests[b] = {}
        if not self.scenario.continuous:  # the steering of the agents' yaw rate
            v, A = self.vehicles, AGENTS
            yaw_rate = wrap_angle(v.heading[:, :A] - self._heading_before) / self.scenario.dt
            wheelbase = 2 * self.scenario.disc_offset
            steer = np.arctan(wheelbase * yaw_rate / np.maximum(v.speed[:, :A], 0.5))
            v.steer = np.where(acting, clip(steer, -MAX_STEER, MAX_STEER), v.steer)

    def _command_agents(self, actions: np.ndarray, acting: np.ndarray) -> None:
        sc, v = self.scenario, self.vehicles
        B, A = sc.num_envs, AGENTS
        if sc.continuous:
            self.driver.drive(actions, acting)
            move = np.concatenate([v.pos[:, :A], v.heading[:, :A, None], v.speed[:, :A, None]], -1)
            move[~acting] = np.nan
            for b in range(B):
                self._requests[b]["move"] = move[b]
            return
        a = actions.reshape(B, A).astype(np.int64)
        speed = v.speed[:, :A]
        target = clip(speed + lane_accel(sc, a, speed) * sc.dt, 0.0, 12.0)
        target = np.where(acting, target, np.nan)
        turn = sc.route_turn[v.route[:, :A]]
        entry = v.s_now < sc.layout.arm_length - 4.0
        change = acting & (turn == TURNS.index("straight")) & entry & ((a == 2) | (a == 3))
        # "Change right" is toward the kerb (SUMO lane 0), "change left" away from it.
        lane = np.where(change, np.where(a == 2, 0, 1), -1)
        self._heading_before = v.heading[:, :A].copy()
        for b in range(B):
            self._requests[b].update(speed=target[b], lane=lane[b])

    def _read(self, b: int, got: dict[str, np.ndarray], acting: np.ndarray) -> None:
        """Env ``b``'s vehicles as SUMO left them (with continuous actions the agents are
        where the bicycle model put them)."""
        v, A = self.vehicles, AGENTS
        slots = slice(A, None) if self.scenario.continuous else slice(None)
        v.pos[b, slots] = got["pos"][slots]
        v.heading[b, slots] = got["heading"][slots]
        v.speed[b, slots] = got["speed"][slots]
        present = got["present"]
        if self.scenario.continuous:
            present[:A] = v.present[b, :A]
        else:  # an agent SUMO took off at its route's end completed it: put it there
            for i in np.flatnonzero(got["arrived"][:A]):
                v.park_at_route_end(b, int(i))
                present[i] = True
        present[:A] &= acting
        v.present[b] = present

    def enter(self, real: np.ndarray, rng: np.random.Generator) -> None:
        """The built-in arrivals, added to SUMO with the next step's request."""
        for envs, slots, routes in self.arrivals.enter(real, rng):
            for b, slot, route in zip(envs, slots, routes, strict=True):
                entry = self._entry(b, slot, route, 0.0, self.vehicles.speed[b, slot])
                self._requests[b].setdefault("add", []).append(entry)

    def _entry(self, b: int, slot: int, route: int, s: float, speed: float) -> tuple:
        """A ``vehicle.add`` request: slot, route, SUMO lane and front-bumper position."""
        sc = self.scenario
        lane = route_edges(sc.routes.keys[route])[2]
        front = float(s) + sc.disc_offset + sc.disc_radius
        return (int(slot), int(route), int(lane), front, float(speed))

    def collisions(self) -> np.ndarray:
        return self.vehicles.collisions()

    def get_state(self) -> dict[str, Any]:
        raise unsaved_state(self.name)

    def set_state(self, state: dict[str, Any]) -> None:
        raise unsaved_state(self.name)

    def close(self) -> None:
        for sim in self._sims:
            sim.close()
        self._sims = []

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()
