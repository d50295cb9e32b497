"""A check the intersection's two backends share: background vehicles stop on red."""

import numpy as np


def entering_on_red(env, steps, actions):
    """Background vehicles that enter the box while their light is red, and all that enter."""
    inside = lambda p: (np.abs(p[..., 0]) <= 12.0) & (np.abs(p[..., 1]) <= 12.0)  # noqa: E731
    on_red = entered = 0
    for _ in range(steps):
        vehicles = env.vehicles
        before, present = vehicles.pos[:, 4:].copy(), vehicles.present[:, 4:].copy()
        arm = env.scenario.route_arm[vehicles.route[:, 4:]]
        light = np.take_along_axis(env.lights(), arm, 1)
        env.step(actions)
        crossed = present & vehicles.present[:, 4:] & ~inside(before) & inside(vehicles.pos[:, 4:])
        entered += crossed.sum()
        on_red += (crossed & (light == 0)).sum()
    return on_red, entered
