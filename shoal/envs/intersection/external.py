"""What the intersection's external simulators (SUMO, SMARTS) share: the SUMO edges of a
built-in route, the per-content cache their generated files are built into, and the error
that says their state cannot be saved."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from shoal.envs.intersection.geometry import TURNS
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


def unsaved_state(simulator: str) -> EnvStateUnsupported:
    """What an external simulator raises for its state: it lives outside shoal's arrays, so
    runs on it restart their episodes on resume."""
    return EnvStateUnsupported(f"{simulator}'s simulation state cannot be captured")
