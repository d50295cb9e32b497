"""The road layout of the built-in intersection: four arms of 4-lane roads (two lanes each
way, driving on the right) meeting at a square box, and the routes through it, as
polylines sampled every metre, with a batched projection of positions onto routes.

Coordinates: the box is centred at the origin, arms run along the axes; arm ``k`` (0 south,
1 east, 2 north, 3 west) is the south arm turned ``k`` quarter turns counter-clockwise.
Lanes are ``lane_width`` wide; lane 0 is the one next to the centre line (the left lane),
lane 1 the kerb lane. A route enters on arm ``k``, lane ``l``, and turns ``straight``,
``left`` or ``right``: right turns from the kerb lane into the exit's kerb lane, left turns
from the left lane into the exit's left lane, straight routes keep their lane. The box's
half-width is two lanes plus ``corner`` (the kerb radius that leaves room to turn).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shoal.envs.intersection.dynamics import clip

TURNS = ("straight", "left", "right")
ARMS = ("south", "east", "north", "west")


@dataclass(frozen=True)
class Layout:
    lane_width: float = 3.5
    arm_length: float = 50.0
    """From the box's edge to the end of an arm."""
    corner: float = 5.0
    spacing: float = 1.0
    """Metres between route waypoints."""

    @property
    def half(self) -> float:
        """Half-width of the intersection box."""
        return 2 * self.lane_width + self.corner


def _rotate(points: np.ndarray, quarter_turns: int) -> np.ndarray:
    angle = quarter_turns * np.pi / 2
    c, s = np.cos(angle), np.sin(angle)
    return points @ np.array([[c, s], [-s, c]])


def _line(start: np.ndarray, end: np.ndarray, spacing: float) -> np.ndarray:
    n = max(2, int(np.ceil(np.linalg.norm(end - start) / spacing)) + 1)
    return start + np.linspace(0.0, 1.0, n)[:, None] * (end - start)


def _arc(center: np.ndarray, radius: float, start: float, end: float, spacing: float) -> np.ndarray:
    n = max(2, int(np.ceil(abs(end - start) * radius / spacing)) + 1)
    angles = np.linspace(start, end, n)
    return center + radius * np.stack([np.cos(angles), np.sin(angles)], 1)


def south_route(layout: Layout, lane: int, turn: str) -> np.ndarray:
    """``[K, 2]`` waypoints of a northbound route entering from the south arm."""
    w, h, far, d = layout.lane_width, layout.half, layout.half + layout.arm_length, layout.spacing
    x = (lane + 0.5) * w  # lane 0 next to the centre line
    entry = _line(np.array([x, -far]), np.array([x, -h]), d)
    if turn == "straight":
        inside = _line(np.array([x, -h]), np.array([x, h]), d)
        exit_ = _line(np.array([x, h]), np.array([x, far]), d)
    elif turn == "right":  # into the east arm's eastbound lane of the same index
        radius = h - x
        inside = _arc(np.array([h, -h]), radius, np.pi, np.pi / 2, d)
        y = -x
        exit_ = _line(np.array([h, y]), np.array([far, y]), d)
    elif turn == "left":  # into the west arm's westbound lane of the same index
        radius = h + x
        inside = _arc(np.array([-h, -h]), radius, 0.0, np.pi / 2, d)
        y = x
        exit_ = _line(np.array([-h, y]), np.array([-far, y]), d)
    else:
        raise ValueError(f"turn must be one of {TURNS}, not {turn!r}")
    return np.concatenate([entry, inside[1:], exit_[1:]])


def route_allowed(lane: int, turn: str) -> bool:
    """Right turns from the kerb lane, left turns from the left lane, straight from both."""
    return turn == "straight" or (turn == "right") == (lane == 1)


@dataclass(frozen=True)
class Routes:
    """Every allowed route, padded to one length: ``points [R, K, 2]``, cumulative arc
    length ``arc [R, K]``, the number of real points ``count [R]`` and each route's entry
    ``(arm, lane, turn index)`` in ``keys``."""

    points: np.ndarray
    arc: np.ndarray
    count: np.ndarray
    keys: tuple[tuple[int, int, int], ...]
    segment_at: np.ndarray
    """``[R, M]``: the segment that holds arc length ``m`` metres (whole metres), for
    projections that search near a known arc length."""

    @property
    def length(self) -> np.ndarray:
        """``[R]`` route lengths."""
        return self.arc[np.arange(len(self.count)), self.count - 1]

    def index(self, arm: int, lane: int, turn: str) -> int:
        return self.keys.index((arm, lane, TURNS.index(turn)))


def build_routes(layout: Layout) -> Routes:
    polylines, keys = [], []
    for arm in range(4):
        for lane in (0, 1):
            for t, turn in enumerate(TURNS):
                if route_allowed(lane, turn):
                    polylines.append(_rotate(south_route(layout, lane, turn), arm))
                    keys.append((arm, lane, t))
    k = max(len(p) for p in polylines)
    points = np.zeros((len(polylines), k, 2))
    arc = np.zeros((len(polylines), k))
    count = np.array([len(p) for p in polylines])
    for r, p in enumerate(polylines):
        seg = np.linalg.norm(np.diff(p, axis=0), axis=1)
        points[r, : len(p)] = p
        points[r, len(p) :] = p[-1]  # padding repeats the last point (zero-length segments)
        arc[r, : len(p)] = np.concatenate([[0.0], np.cumsum(seg)])
        arc[r, len(p) :] = arc[r, len(p) - 1]
    metres = np.arange(int(np.ceil(arc.max())) + 2)
    segment_at = np.stack(
        [np.clip(np.searchsorted(a[:c], metres, side="right") - 1, 0, c - 2)
         for a, c in zip(arc, count, strict=True)]
    )  # fmt: skip
    return Routes(points, arc, count, tuple(keys), segment_at)


def project(
    routes: Routes,
    route: np.ndarray,
    position: np.ndarray,
    near: np.ndarray | None = None,
    window: int = 24,
) -> tuple[np.ndarray, ...]:
    """Positions ``[V, 2]`` on their routes ``[V]``: arc length ``s`` of the closest point,
    signed lateral offset ``d`` (positive left of the direction of travel) and the route's
    heading there, each ``[V]``. With ``near`` (``[V]`` arc lengths, e.g. the last step's),
    only the ``window`` segments from 6 m behind it are searched (a vehicle moves 1.5 m a
    step at most), instead of the whole route."""
    if near is None:
        pts = routes.points[route]  # [V, K, 2]
        a, b = pts[:, :-1], pts[:, 1:]
        arc = routes.arc[route]
    else:
        last = routes.segment_at.shape[1] - 1
        metre = clip(np.floor(near - 6.0), 0, last).astype(np.int64)
        first = routes.segment_at[route, metre]
        k = routes.points.shape[1]
        first = clip(first, 0, max(k - 1 - window, 0))
        index = first[:, None] + np.arange(min(window, k - 1))  # [V, W]
        rows = route[:, None]
        a, b = routes.points[rows, index], routes.points[rows, index + 1]
        arc = routes.arc[rows, index]
    seg = b - a
    seg_len2 = (seg * seg).sum(-1)
    rel = position[:, None, :] - a
    t = clip((rel * seg).sum(-1) / np.maximum(seg_len2, 1e-12), 0.0, 1.0)
    closest = a + t[..., None] * seg
    dist2 = ((position[:, None, :] - closest) ** 2).sum(-1)
    dist2 = np.where(seg_len2 > 0, dist2, np.inf)  # padding segments never win
    best = np.argmin(dist2, axis=1)
    rows = np.arange(len(route))
    direction = seg[rows, best] / np.sqrt(np.maximum(seg_len2[rows, best], 1e-12))[:, None]
    offset = position - closest[rows, best]
    lateral = direction[:, 0] * offset[:, 1] - direction[:, 1] * offset[:, 0]
    s = arc[rows, best] + t[rows, best] * np.sqrt(seg_len2[rows, best])
    heading = np.arctan2(direction[:, 1], direction[:, 0])
    return s, lateral, heading


def point_at(routes: Routes, route: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions ``[V, 2]`` and headings ``[V]`` at arc lengths ``s`` ``[V]`` (clipped to
    the route)."""
    arc = routes.arc[route]  # [V, K]
    count = routes.count[route]
    rows = np.arange(len(route))
    s = clip(s, 0.0, arc[rows, count - 1])
    i = clip((arc <= s[:, None]).sum(1) - 1, 0, np.maximum(count - 2, 0))
    a, b = routes.points[route, i], routes.points[route, i + 1]
    seg = np.maximum(arc[rows, i + 1] - arc[rows, i], 1e-12)
    t = clip((s - arc[rows, i]) / seg, 0.0, 1.0)
    direction = b - a
    return a + t[:, None] * direction, np.arctan2(direction[:, 1], direction[:, 0])
