"""What an agent of the intersection observes, computed from the vehicle arrays whatever
simulator moved them (see `shoal.envs.intersection.env` for the layout): its own features and
its nearest neighbours (`agent_features`), the optional bird's-eye occupancy grid
(`occupancy`), and the global state of the centralized critics (`global_state`)."""

from __future__ import annotations

import numpy as np

from shoal.envs.intersection.dynamics import wrap_angle
from shoal.envs.intersection.geometry import point_at
from shoal.envs.intersection.scenario import AGENTS
from shoal.envs.intersection.vehicles import Vehicles

NEIGHBOUR_DIM = 7
"""Entries per neighbour: relative position (2), distance, speed, presence, and velocity
relative to the agent (2)."""
OBS_DIM = 8 + 8 * NEIGHBOUR_DIM
"""Entries of `agent_features`: 8 of the agent's own, `NEIGHBOUR_DIM` per neighbour."""
SCALE, SPEED_SCALE = 50.0, 10.0


def agent_features(
    v: Vehicles, neighbours: int, sensor_range: float, lookahead: tuple[float, ...]
) -> np.ndarray:
    """``[B, A, OBS_DIM]``: each agent's goal relative to it, distance to its target lane
    centre, speed, steering, heading errors to the route ``lookahead`` metres ahead, and its
    ``neighbours`` closest vehicles within ``sensor_range`` (relative position, distance,
    speed, presence, velocity relative to the agent's; nearest first, zeros past the last),
    in its own frame. The relative velocity is what lets an agent tell a car that will cross
    its path from one that has passed or waits: with it, a driver extrapolating every
    neighbour at constant velocity completes 0.98 of routes at low traffic, where without it
    the best scripted driver completed 0.61."""
    sc = v.scenario
    B, A = sc.num_envs, AGENTS
    pos, heading = v.pos[:, :A], v.heading[:, :A]
    c, s = np.cos(heading), np.sin(heading)

    def ego(x: np.ndarray) -> np.ndarray:  # world vectors [B, A, ..., 2] -> agent frame
        cc, ss = c.reshape(B, A, *([1] * (x.ndim - 3))), s.reshape(B, A, *([1] * (x.ndim - 3)))
        return np.stack([cc * x[..., 0] + ss * x[..., 1], -ss * x[..., 0] + cc * x[..., 1]], -1)

    routes = v.route[:, :A]
    rows = routes.reshape(-1)
    ends = sc.routes.points[rows, sc.routes.count[rows] - 1].reshape(B, A, 2)
    ahead = v.s_now[..., None] + np.array(lookahead)  # [B, A, 3], one lookup
    _, path = point_at(sc.routes, np.repeat(rows, len(lookahead)), ahead.reshape(-1))
    errors = wrap_angle(path.reshape(ahead.shape) - heading[..., None])
    rel = v.pos[:, None, :, :] - pos[:, :, None, :]  # [B, A, V, 2]
    dist = np.sqrt((rel * rel).sum(-1))
    seen = v.present[:, None, :] & (dist <= sensor_range)
    seen[:, np.arange(A), np.arange(A)] = False
    order = np.argsort(np.where(seen, dist, np.inf), axis=2)[:, :, :neighbours]
    b_, a_ = np.arange(B)[:, None, None], np.arange(A)[None, :, None]
    n_seen = seen[b_, a_, order]
    n_rel = ego(rel[b_, a_, order]) / SCALE
    n_dist = dist[b_, a_, order] / SCALE
    n_speed = v.speed[b_, order] / SPEED_SCALE
    velocity = v.speed[..., None] * np.stack([np.cos(v.heading), np.sin(v.heading)], -1)
    n_vel = ego(velocity[b_, order] - velocity[:, :A, None, :]) / SPEED_SCALE
    columns = [n_rel, n_dist[..., None], n_speed[..., None], n_seen[..., None], n_vel]
    near = np.concatenate(columns, -1) * n_seen[..., None]
    own = [
        ego(ends - pos) / SCALE,
        (v.lateral - v.target_offset)[..., None],
        v.speed[:, :A, None] / SPEED_SCALE,
        v.steer[..., None],
        errors,
        near.reshape(B, A, -1),
    ]
    return np.concatenate(own, -1)


def global_state(v: Vehicles, lights: np.ndarray | None = None) -> np.ndarray:
    """``[B, S]`` float32: every vehicle's position (/50), heading (cos, sin), speed (/10)
    and presence, then the four arms' ``lights`` (/2) when given."""
    state = np.concatenate(
        [
            v.pos / SCALE,
            np.cos(v.heading)[..., None],
            np.sin(v.heading)[..., None],
            v.speed[..., None] / SPEED_SCALE,
            v.present[..., None],
        ],
        -1,
    ).reshape(v.scenario.num_envs, -1)
    if lights is not None:
        state = np.concatenate([state, lights / 2], -1)
    return state.astype(np.float32)


def occupancy(v: Vehicles, grid: int, cell: float) -> np.ndarray:
    """``[B, A, 2, G, G]`` uint8, ``G = grid``: road and other vehicles' discs in the cells
    of ``cell`` metres around each agent (cell ``[i, j]``: ``i`` ahead, ``j`` to the left, the
    vehicle at the centre)."""
    sc = v.scenario
    B, A, G = sc.num_envs, AGENTS, grid
    centres = (np.arange(G) - (G - 1) / 2) * cell
    local = np.stack(np.meshgrid(centres, centres, indexing="ij"), -1).reshape(-1, 2)
    c, s = np.cos(v.heading[:, :A]), np.sin(v.heading[:, :A])
    rot = np.stack([np.stack([c, -s], -1), np.stack([s, c], -1)], -2)  # [B, A, 2, 2]
    world = v.pos[:, :A, None, :] + np.einsum("baij,kj->baki", rot, local)
    lanes, extent = 2 * sc.layout.lane_width, sc.layout.half + sc.layout.arm_length
    x, y = np.abs(world[..., 0]), np.abs(world[..., 1])
    road = ((x <= lanes) | (y <= lanes)) & (x <= extent) & (y <= extent)
    cells = np.zeros((B, A, 2, G * G), np.uint8)
    cells[:, :, 0] = road
    discs = v.discs().reshape(B, 1, -1, 2)  # [B, 1, 2V, 2]: vehicle v's discs 2v, 2v+1
    rel = discs - v.pos[:, :A, None, :]
    ahead = c[..., None] * rel[..., 0] + s[..., None] * rel[..., 1]
    left = -s[..., None] * rel[..., 0] + c[..., None] * rel[..., 1]
    i = np.floor(ahead / cell + G / 2).astype(np.int64)
    j = np.floor(left / cell + G / 2).astype(np.int64)
    other = np.repeat(v.present, 2, axis=1)[:, None, :] & (
        np.arange(2 * sc.slots)[None, None, :] // 2 != np.arange(A)[None, :, None]
    )
    hit = other & (i >= 0) & (i < G) & (j >= 0) & (j < G)
    b, a, k = np.nonzero(hit)
    cells[b, a, 1, i[b, a, k] * G + j[b, a, k]] = 1
    return cells.reshape(B, A, 2, G, G)
