"""What every simulator of the intersection shares and never changes during a run: the
layout and its routes (`shoal.envs.intersection.geometry`), the agents and the vehicle slots,
the background traffic's rate and driver model, the routes the agents draw, the vehicles' size
and the signal cycle. `Scenario` validates the options a user gives (``traffic``, ``routes``,
``continuous``, ``background``, ``signals``), with errors that name them."""

from __future__ import annotations

from typing import Any

import numpy as np

from shoal.core.errors import ConfigError
from shoal.envs.intersection.dynamics import IDMParams
from shoal.envs.intersection.geometry import Layout, build_routes

ENV_ID = "shoal/intersection-v0"
GROUP = "agent"
AGENTS = 4
TRAFFIC = {"none": 0.0, "low": 10.0, "high": 30.0}
"""Background vehicles per minute entering over all eight entry lanes."""
FIXED_ROUTES = ((1, "straight"), (0, "left"), (1, "right"), (1, "straight"))
"""``routes="fixed"``: (lane, turn) of the agent entering on arm 0, 1, 2, 3."""
SIGNAL_CYCLE = ((12.0, 2, 0), (3.0, 1, 0), (1.0, 0, 0), (12.0, 0, 2), (3.0, 0, 1), (1.0, 0, 0))
"""``signals=True``: the phases' (seconds, north-south light, east-west light), lights 0 red,
1 yellow, 2 green."""
START_S, START_SPEED = 15.0, 8.0
"""Where (metres into its arm) and how fast an agent starts its route."""


def flag(value: Any, name: str, env_id: str = ENV_ID) -> bool:
    """A yes/no option given as a bool or as text (``true``/``false`` from a command line)."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    text = str(value).strip().lower()
    if text in ("true", "yes", "1", "on"):
        return True
    if text in ("false", "no", "0", "off"):
        return False
    raise ConfigError(f"{env_id}: {name} is true or false, not {value!r}")


class Scenario:
    """The fixed parts of a batch of intersections (see the module docstring)."""

    dt = 0.1
    """Seconds per step."""
    target_speed = 10.0
    """The background traffic's desired speed and the agents' cruising speed (m/s)."""
    disc_radius, disc_offset = 1.0, 1.25
    """A vehicle is two discs of this radius, this far ahead of and behind its centre."""

    def __init__(
        self,
        num_envs: int,
        *,
        traffic: str | float = "low",
        routes: str = "random",
        continuous: bool = False,
        background: int = 12,
        signals: bool = False,
        env_id: str = ENV_ID,
    ):
        self.env_id = env_id
        if isinstance(traffic, str):
            if traffic not in TRAFFIC:
                raise ConfigError(
                    f"{env_id}: traffic must be one of {list(TRAFFIC)} or vehicles per minute, "
                    f"not {traffic!r}"
                )
            traffic = TRAFFIC[traffic]
        if not 0.0 <= float(traffic) <= 120.0:
            raise ConfigError(f"{env_id}: traffic = {traffic} vehicles/min is outside [0, 120]")
        if routes not in ("random", "fixed"):
            raise ConfigError(f"{env_id}: routes must be 'random' or 'fixed', not {routes!r}")
        if num_envs < 1 or background < 0:
            raise ConfigError(f"{env_id}: num_envs >= 1 and background >= 0 needed")
        self.num_envs = int(num_envs)
        self.vehicles_per_minute = float(traffic)
        self.fixed_routes = routes == "fixed"
        self.continuous = flag(continuous, "continuous", env_id)
        self.signals = flag(signals, "signals", env_id)
        self.slots = AGENTS + int(background)
        """Vehicle slots per env: the agents first, then the background vehicles."""
        self.layout = Layout()
        self.routes = build_routes(self.layout)
        self.idm = IDMParams(desired_speed=self.target_speed)
        keys = self.routes.keys
        entries = [(arm, lane) for arm in range(4) for lane in (0, 1)]
        self.entry_routes = [[r for r, key in enumerate(keys) if key[:2] == e] for e in entries]
        """The routes that begin at each of the eight entry lanes."""
        self.entry_points = np.array([self.routes.points[rs[0], 0] for rs in self.entry_routes])
        self.route_lane = np.array([key[1] for key in keys])
        self.route_arm = np.array([key[0] for key in keys])
        self.route_turn = np.array([key[2] for key in keys])
        self._agent_routes = [
            [r for r, key in enumerate(keys) if key[0] == i] for i in range(AGENTS)
        ]
        self._phase_ends = np.cumsum([p[0] for p in SIGNAL_CYCLE])
        self._phase_lights = np.array([p[1:] for p in SIGNAL_CYCLE])[:, [0, 1, 0, 1]]

    @property
    def cycle_s(self) -> float:
        """The length of the signal cycle in seconds."""
        return float(self._phase_ends[-1])

    def agent_routes(self, agent: int, count: int, rng: np.random.Generator) -> np.ndarray:
        """``[count]`` routes for agent ``agent`` (entering on arm ``agent``) at new episodes:
        its fixed route, or one drawn from its arm's routes."""
        if self.fixed_routes:
            lane, turn = FIXED_ROUTES[agent]
            return np.full(count, self.routes.index(agent, lane, turn))
        return np.array(self._agent_routes[agent])[
            rng.integers(len(self._agent_routes[agent]), size=count)
        ]

    def lights(self, signal_offset: np.ndarray, t: np.ndarray) -> np.ndarray:
        """``[B, 4]``: each arm's light after ``t`` steps of episodes that began
        ``signal_offset`` seconds into the cycle, 0 red, 1 yellow, 2 green (all green
        without ``signals``)."""
        if not self.signals:
            return np.full((len(t), 4), 2)
        time = (signal_offset + t * self.dt) % self._phase_ends[-1]
        return self._phase_lights[np.searchsorted(self._phase_ends, time, side="right")]
