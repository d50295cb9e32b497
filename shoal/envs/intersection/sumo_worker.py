"""One Eclipse SUMO simulation of the intersection, driven through libsumo, for
`shoal.envs.intersection.sumo`.

libsumo runs one simulation per process, so `SumoIntersectionEnv` runs each env's
`Simulation` in a process of its own: this file run as a script (``python sumo_worker.py``),
which imports only libsumo and NumPy (not shoal, nor torch) and answers pickled requests on
its standard input and output. With one env and no other SUMO simulation in the process,
`Simulation` runs in-process instead.

Vehicle positions here are their centres (SUMO reports the front bumper); headings are in
radians counter-clockwise from east (SUMO's angles are degrees clockwise from north).
"""

from __future__ import annotations

import math
import os
import pickle
import struct
import sys
from typing import IO, Any

import numpy as np


class Simulation:
    """A SUMO simulation of ``net`` with ``routes`` (a routes file defining the vehicle
    types ``agent`` and ``background`` and routes ``r0``, ``r1``, ...), ``slots`` vehicle
    slots (the first ``agents`` for the learning agents) and a step of 0.1 s.

    `step` takes one request and answers with every slot's centre ``[V, 2]``, heading,
    speed, presence and whether it reached its route's end (and left) this step ``[V]``.
    """

    def __init__(
        self,
        net: str,
        routes: str,
        slots: int,
        agents: int,
        length: float,
        seed: int,
        signals: bool = False,
    ) -> None:
        import libsumo

        self.traci = libsumo
        self.slots, self.agents, self.half = slots, agents, length / 2.0
        self.ids: list[str | None] = [None] * slots
        self.serial = 0
        libsumo.start(
            ["sumo", "-n", net, "-r", routes, "--step-length", "0.1", "--seed", str(seed),
             "--no-step-log", "true", "--no-warnings", "true", "--collision.action", "none",
             "--time-to-teleport", "-1", "--begin", "0"]
        )  # fmt: skip
        self.links: list[tuple[int, bool]] = []
        """With signals: each signal link's entry arm and whether it turns left."""
        if signals:
            arms = "SENW"
            for (in_lane, out_lane, _), *_ in libsumo.trafficlight.getControlledLinks("C"):
                direction = next(
                    link[6] for link in libsumo.lane.getLinks(in_lane) if link[0] == out_lane
                )
                self.links.append((arms.index(in_lane[0]), direction == "l"))

    def step(self, request: dict[str, Any]) -> dict[str, np.ndarray] | None:
        """``request``: ``clear`` (remove every vehicle: a new episode), ``add`` (a list of
        ``(slot, route, lane, pos, speed)``: SUMO lane index, front-bumper lane position),
        ``remove`` (agent slots to take off the road), ``speed`` (``[A]`` speeds to hold
        this step, NaN: none), ``lane`` (``[A]`` SUMO lane index to change to, -1: none),
        ``move`` (``[A, 4]`` centre x, y, heading and speed to put agents at, NaN rows: none),
        ``lights`` (with signals, each arm's light: 0 red, 1 yellow, 2 green; left turns on
        green yield to oncoming traffic) and ``advance`` (False: only apply the request)."""
        v = self.traci.vehicle
        if request.get("clear"):
            for vid in list(v.getIDList()) + list(self.traci.simulation.getPendingVehicles()):
                v.remove(vid)
            self.ids = [None] * self.slots
        fresh = False
        for slot, route, lane, pos, speed in request.get("add", ()):
            vid = f"v{self.serial}"
            self.serial += 1
            kind = "agent" if slot < self.agents else "background"
            v.add(vid, f"r{route}", typeID=kind, depart="now", departLane=str(lane),
                  departPos=f"{pos:.3f}", departSpeed=f"{speed:.3f}")  # fmt: skip
            if kind == "agent":
                v.setSpeedMode(vid, 0)  # agents ignore safe speeds and right of way
                v.setLaneChangeMode(vid, 0)  # and change lanes only when told
                fresh = True
            self.ids[slot] = vid
        if fresh:  # vehicles enter at their depart position on the next step
            self.traci.simulationStep()
        for slot in request.get("remove", ()):
            if self.ids[slot] is not None:
                v.remove(self.ids[slot])
                self.ids[slot] = None
        if not request.get("advance", True):
            return None
        lights = request.get("lights")
        if lights is not None and self.links:
            state = "".join(
                ("g" if left else "G") if lights[arm] == 2 else "ry"[lights[arm]]
                for arm, left in self.links
            )
            self.traci.trafficlight.setRedYellowGreenState("C", state)
        speed, lane, move = request.get("speed"), request.get("lane"), request.get("move")
        for i in range(self.agents):
            vid = self.ids[i]
            if vid is None:
                continue
            if speed is not None and not math.isnan(speed[i]):
                v.setSpeed(vid, float(speed[i]))
            if lane is not None and lane[i] >= 0 and v.getLaneIndex(vid) != lane[i]:
                v.changeLane(vid, int(lane[i]), 0.5)
            if move is not None and not math.isnan(move[i, 0]):
                x, y, heading, new_speed = (float(m) for m in move[i])
                front = (x + self.half * math.cos(heading), y + self.half * math.sin(heading))
                angle = 90.0 - math.degrees(heading)
                v.moveToXY(vid, "", -1, front[0], front[1], angle, keepRoute=1)
                v.setSpeed(vid, new_speed)
        self.traci.simulationStep()
        return self.read()

    def read(self) -> dict[str, np.ndarray]:
        v = self.traci.vehicle
        live = set(v.getIDList())
        pos = np.zeros((self.slots, 2))
        heading, speed = np.zeros(self.slots), np.zeros(self.slots)
        present, arrived = np.zeros(self.slots, bool), np.zeros(self.slots, bool)
        for slot, vid in enumerate(self.ids):
            if vid is None:
                continue
            if vid not in live:
                if vid in self.traci.simulation.getPendingVehicles():
                    continue  # not inserted yet
                self.ids[slot] = None  # it reached the end of its route
                arrived[slot] = True
                continue
            x, y = v.getPosition(vid)
            h = math.radians(90.0 - v.getAngle(vid))
            pos[slot] = (x - self.half * math.cos(h), y - self.half * math.sin(h))
            heading[slot] = math.atan2(math.sin(h), math.cos(h))
            speed[slot] = v.getSpeed(vid)
            present[slot] = True
        return {
            "pos": pos,
            "heading": heading,
            "speed": speed,
            "present": present,
            "arrived": arrived,
        }

    def close(self) -> None:
        self.traci.close()


def read_message(stream: IO[bytes]) -> Any:
    """One pickled message; `EOFError` when the other side has gone."""
    header = stream.read(4)
    if len(header) < 4:
        raise EOFError
    (size,) = struct.unpack("<I", header)
    return pickle.loads(stream.read(size))


def write_message(stream: IO[bytes], message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(struct.pack("<I", len(data)) + data)
    stream.flush()


def serve() -> None:
    """The worker process: requests on stdin, answers on the original stdout (SUMO's own
    messages go to stderr). The first request holds `Simulation`'s arguments."""
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    requests = sys.stdin.buffer
    sim = None
    while True:
        try:
            request = read_message(requests)
        except EOFError:
            break
        try:
            if sim is None:
                sim = Simulation(**request)
                answer: Any = "ready"
            elif request == "close":
                break
            else:
                answer = sim.step(request)
        except Exception as error:  # the parent raises it with the worker's message
            answer = RuntimeError(f"SUMO worker: {type(error).__name__}: {error}")
        write_message(answers, answer)
    if sim is not None:
        sim.close()


if __name__ == "__main__":
    serve()
