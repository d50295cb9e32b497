"""What the intersection's external simulators (SUMO, SMARTS) share: the base class that
gives up saving state, where an agent that left at its route's end is put, the SUMO edges of
a built-in route, and the per-content cache their generated files are built into."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from shoal.envs.intersection.env import IntersectionEnv
from shoal.envs.intersection.geometry import TURNS, point_at
from shoal.envs.snapshot import EnvStateUnsupported

ARM_NAMES = ("S", "E", "N", "W")
EXIT_ARM = {"straight": 2, "left": 3, "right": 1}
"""Quarter turns counter-clockwise from the entry arm to the exit arm."""


def route_edges(key: tuple[int, int, int]) -> tuple[str, str, int]:
    """A built-in route's (arm, lane, turn index) as SUMO's entry edge, exit edge and lane
    index (SUMO counts lanes from the kerb: the built-in lane 0, next to the centre line, is
    SUMO's 1)."""
    arm, lane, turn = key
    exit_arm = (arm + EXIT_ARM[TURNS[turn]]) % 4
    return f"{ARM_NAMES[arm]}_in", f"{ARM_NAMES[exit_arm]}_out", 1 - lane


def cache_dir(name: str) -> Path:
    """``~/.cache/shoal/<name>`` (under ``XDG_CACHE_HOME`` when set)."""
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "shoal" / name


def build_once(target: Path, make: Callable[[Path], None]) -> Path:
    """``target``, a directory ``make`` fills, built once: in a temporary directory beside
    it, then renamed into place, so that a directory that exists is complete (a process that
    loses the race to build it keeps the winner's; a failed build leaves nothing)."""
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=target.parent))
    try:
        make(work)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    try:
        os.replace(work, target)
    except OSError:  # another process built it first
        shutil.rmtree(work, ignore_errors=True)
    return target


class ExternalSimulator(IntersectionEnv):
    """The intersection with another simulator moving the vehicles (SUMO, SMARTS): its state
    lives outside these arrays and cannot be saved, so runs restart episodes on resume."""

    simulator: ClassVar[str] = ""

    def _finished_route(self, b: int, i: int) -> None:
        """Agent ``i`` of env ``b`` left the simulator at its route's end: put it there, so
        that the built-in completion test sees it complete."""
        route = self.route[b, i : i + 1]
        end, heading = point_at(self.routes, route, self.routes.length[route])
        self.pos[b, i], self.heading[b, i] = end[0], heading[0]

    def get_state(self) -> dict[str, Any]:
        raise EnvStateUnsupported(f"{self.simulator}'s simulation state cannot be captured")

    def set_state(self, state: dict[str, Any]) -> None:
        raise EnvStateUnsupported(f"{self.simulator}'s simulation state cannot be captured")
