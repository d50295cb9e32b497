"""Vehicle dynamics of the built-in intersection, as batched array functions (every argument
an array over vehicles, broadcast together; no Python loop per vehicle).

* `idm_acceleration`: the Intelligent Driver Model of Treiber, Hennecke and Helbing 2000
  ("Congested traffic states in empirical observations and microscopic simulations"), the
  car-following law of the background traffic;
* `bicycle_step`: the kinematic bicycle model about the centre of gravity of Kong, Pfeiffer,
  Schildbach and Borrelli 2015 ("Kinematic and dynamic vehicle models for autonomous driving
  control design"), integrated with explicit Euler steps of ``dt`` (0.1 s).

Units: metres, seconds, radians.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def clip(x, low, high) -> np.ndarray:
    """``np.clip`` as two ufuncs: the same values, without ``np.clip``'s argument handling,
    which costs more than the clipping on the small arrays of a few envs."""
    return np.minimum(np.maximum(x, low), high)


@dataclass(frozen=True)
class IDMParams:
    """IDM's parameters; the defaults are Treiber et al.'s city-traffic values."""

    desired_speed: float = 12.0
    """v0, m/s (about 43 km/h)."""
    time_headway: float = 1.5
    """T, s."""
    min_gap: float = 2.0
    """s0, m: the gap kept at standstill."""
    max_accel: float = 1.0
    """a, m/s^2."""
    comfort_decel: float = 1.5
    """b, m/s^2."""
    exponent: float = 4.0
    """delta."""


def idm_acceleration(
    speed: np.ndarray, gap: np.ndarray, approach: np.ndarray, params: IDMParams = IDMParams()
) -> np.ndarray:
    """IDM's acceleration ``a [1 - (v / v0)^delta - (s* / s)^2]`` with the desired gap
    ``s* = s0 + max(0, v T + v dv / (2 sqrt(a b)))``.

    Args:
        speed: ``v``, the vehicle's speed.
        gap: ``s``, the bumper-to-bumper distance to the vehicle (or stop point) ahead;
            ``inf`` on a free road.
        approach: ``dv = v - v_ahead``, how fast the gap closes (0 on a free road).
    """
    p = params
    speed = np.asarray(speed, np.float64)
    desired = p.min_gap + np.maximum(
        0.0,
        speed * p.time_headway
        + speed * np.asarray(approach) / (2.0 * np.sqrt(p.max_accel * p.comfort_decel)),
    )
    gap = np.maximum(np.asarray(gap, np.float64), 1e-3)  # touching: the strongest braking
    interaction = np.where(np.isinf(gap), 0.0, (desired / gap) ** 2)
    return p.max_accel * (1.0 - (speed / p.desired_speed) ** p.exponent - interaction)


@dataclass(frozen=True)
class BicycleParams:
    """A passenger car: distances from the centre of gravity to the axles and limits."""

    front: float = 1.4
    """l_f, m."""
    rear: float = 1.4
    """l_r, m."""
    max_steer: float = 0.6
    """|delta| limit, rad (about 34 degrees)."""
    max_speed: float = 15.0
    """m/s."""


def bicycle_step(
    x: np.ndarray,
    y: np.ndarray,
    heading: np.ndarray,
    speed: np.ndarray,
    accel: np.ndarray,
    steer: np.ndarray,
    dt: float = 0.1,
    params: BicycleParams = BicycleParams(),
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One Euler step of the kinematic bicycle model (Kong et al. 2015, Eq. 1):

    ``beta = atan(l_r / (l_f + l_r) tan(delta))``, ``x' = v cos(psi + beta)``,
    ``y' = v sin(psi + beta)``, ``psi' = v / l_r sin(beta)``, ``v' = a``;

    the steering angle is clipped to ``max_steer`` and the speed to ``[0, max_speed]`` (no
    reversing). Returns the new ``(x, y, heading, speed)``; the heading is wrapped to
    ``(-pi, pi]``."""
    p = params
    steer = clip(steer, -p.max_steer, p.max_steer)
    beta = np.arctan(p.rear / (p.front + p.rear) * np.tan(steer))
    new_x = x + speed * np.cos(heading + beta) * dt
    new_y = y + speed * np.sin(heading + beta) * dt
    new_heading = wrap_angle(heading + speed / p.rear * np.sin(beta) * dt)
    new_speed = clip(speed + accel * dt, 0.0, p.max_speed)
    return new_x, new_y, new_heading, new_speed


def wrap_angle(angle: np.ndarray) -> np.ndarray:
    """Angles in ``(-pi, pi]``."""
    wrapped = np.remainder(np.asarray(angle) + np.pi, 2 * np.pi) - np.pi
    return np.where(wrapped == -np.pi, np.pi, wrapped)
