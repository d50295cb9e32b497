"""What moves the intersection's vehicles: the `Simulator` protocol, and the one place that
chooses an implementation by name (`make_simulator`).

An environment (`shoal.envs.intersection.env.IntersectionEnv`) owns the scenario, the vehicle
arrays (`shoal.envs.intersection.vehicles.Vehicles`) and everything it computes from them
(observations, rewards, outcomes, metrics); a simulator is given both and moves the vehicles:

* ``builtin`` (`shoal.envs.intersection.kinematic`): kinematic models, batched; exact state.
* ``sumo`` (`shoal.envs.intersection.sumo`): Eclipse SUMO through libsumo, one simulation per
  env; the same arrival process as the built-in one. Extra ``shoal[sumo]``.
* ``smarts`` (`shoal.envs.intersection.smarts`): SMARTS, with SUMO's traffic; its own
  background flows and collision events. Extra ``shoal[smarts]``.
"""

from __future__ import annotations

import inspect
from typing import Any, Protocol

import numpy as np

from shoal.core.errors import ConfigError
from shoal.envs.intersection.vehicles import Vehicles

BACKENDS = ("builtin", "sumo", "smarts")


class Simulator(Protocol):
    """Moves the vehicles of a batch of intersections, writing their states into the
    `Vehicles` it was built with."""

    name: str
    """What the simulator is called in messages (``built-in``, ``SUMO``, ``SMARTS``)."""

    def reset(self, envs: np.ndarray) -> None:
        """New episodes in ``envs``: the environment has placed their agents at their start
        poses on the routes it drew (and cleared every other vehicle); the simulator starts
        its own episode there and may write the vehicles back."""
        ...

    def move(
        self, actions: np.ndarray, acting: np.ndarray, real: np.ndarray, lights: np.ndarray
    ) -> None:
        """One step of 0.1 s in the envs marked ``real`` ``[B]``: the ``acting`` agents
        ``[B, A]`` by their ``actions`` (agents that are done leave the road), the background
        traffic on its own, under the traffic ``lights`` ``[B, 4]``. Afterwards every slot's
        pose, speed and presence, and the agents' steering, are the simulator's."""
        ...

    def collisions(self) -> np.ndarray:
        """``[B, A]``: which agents collided in the last step."""
        ...

    def enter(self, real: np.ndarray, rng: np.random.Generator) -> None:
        """Background vehicles entering after the step, drawing from ``rng``."""
        ...

    def get_state(self) -> dict[str, Any]:
        """The simulator's own state beside the vehicle arrays, or `EnvStateUnsupported`
        where it lives outside them (an external simulator)."""
        ...

    def set_state(self, state: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def make_simulator(
    backend: str, vehicles: Vehicles, rng: np.random.Generator, options: dict[str, Any]
) -> Simulator:
    """The simulator ``backend`` names over ``vehicles``, with its own ``options`` (SUMO:
    ``processes``; SMARTS: ``headless``)."""
    env_id = vehicles.scenario.env_id
    cls: type[Simulator]
    if backend == "builtin":
        from shoal.envs.intersection.kinematic import KinematicSimulator

        cls = KinematicSimulator
    elif backend == "sumo":
        from shoal.envs.intersection.sumo import SumoSimulator

        cls = SumoSimulator
    elif backend == "smarts":
        from shoal.envs.intersection.smarts import SmartsSimulator

        cls = SmartsSimulator
    else:
        raise ConfigError(f"{env_id}: backend must be one of {list(BACKENDS)}, not {backend!r}")
    try:
        inspect.signature(cls).bind(vehicles, rng, **options)
    except TypeError as error:
        raise ConfigError(f"{env_id}: bad env.kwargs for the {backend} backend: {error}") from None
    return cls(vehicles, rng, **options)
