"""A check the intersection's two backends share: background vehicles stop on red."""

import numpy as np


def entering_on_red(env, steps, actions):
    """Background vehicles that enter the box while their light is red, and all that enter."""
    inside = lambda p: (np.abs(p[..., 0]) <= 12.0) & (np.abs(p[..., 1]) <= 12.0)  # noqa: E731
    on_red = entered = 0
    for _ in range(steps):
        before, present = env.pos[:, 4:].copy(), env.present[:, 4:].copy()
        light = np.take_along_axis(env.lights(), env._route_arm[env.route[:, 4:]], 1)
        env.step(actions)
        crossed = present & env.present[:, 4:] & ~inside(before) & inside(env.pos[:, 4:])
        entered += crossed.sum()
        on_red += (crossed & (light == 0)).sum()
    return on_red, entered
