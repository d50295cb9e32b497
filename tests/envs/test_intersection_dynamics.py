"""The intersection's building blocks against hand-computed cases: IDM acceleration,
kinematic bicycle steps, the route layout and projections onto routes."""

import numpy as np
import pytest

from shoal.envs.intersection.dynamics import (
    BicycleParams,
    IDMParams,
    bicycle_step,
    idm_acceleration,
    wrap_angle,
)
from shoal.envs.intersection.geometry import (
    Layout,
    build_routes,
    point_at,
    project,
    route_allowed,
)


def test_idm_by_hand():
    p = IDMParams(desired_speed=10.0, time_headway=1.5, min_gap=2.0, max_accel=1.0,
                  comfort_decel=1.5, exponent=4.0)  # fmt: skip
    # Free road at half the desired speed: a (1 - 0.5^4).
    assert idm_acceleration(5.0, np.inf, 0.0, p) == pytest.approx(1.0 - 0.0625)
    # Following at 10 m/s, 20 m behind a car at the same speed: s* = 2 + 15 = 17,
    # a = 1 - 1 - (17 / 20)^2.
    assert idm_acceleration(10.0, 20.0, 0.0, p) == pytest.approx(-(0.85**2))
    # Closing at 2 m/s: s* = 2 + 8 * 1.5 + 8 * 2 / (2 sqrt(1.5)); gap 30.
    desired = 2 + 12 + 16 / (2 * np.sqrt(1.5))
    want = 1 - (8 / 10) ** 4 - (desired / 30) ** 2
    assert idm_acceleration(8.0, 30.0, 2.0, p) == pytest.approx(want)
    # Standing behind a stopped car: at the gap s0 it stays (a = 0), 1 m away it backs off
    # as hard as a (1 - (2 / 1)^2) = -3 asks (the vehicle model then clips at zero speed).
    assert idm_acceleration(0.0, 2.0, 0.0, p) == pytest.approx(0.0)
    assert idm_acceleration(0.0, 1.0, 0.0, p) == pytest.approx(-3.0)
    batch = idm_acceleration(np.array([5.0, 10.0]), np.array([np.inf, 20.0]), np.zeros(2), p)
    np.testing.assert_allclose(batch, [0.9375, -(0.85**2)])


def test_bicycle_by_hand():
    p = BicycleParams(front=1.0, rear=1.5, max_steer=0.5, max_speed=20.0)
    x, y, h, v = bicycle_step(0.0, 0.0, 0.0, 10.0, 2.0, 0.0, 0.1, p)  # straight ahead
    assert (x, y, h, v) == pytest.approx((1.0, 0.0, 0.0, 10.2))
    # Steering 0.3 rad: beta = atan(1.5 / 2.5 tan 0.3), heading rate v / l_r sin(beta).
    beta = np.arctan(0.6 * np.tan(0.3))
    x, y, h, v = bicycle_step(1.0, 2.0, np.pi / 2, 10.0, 0.0, 0.3, 0.1, p)
    assert x == pytest.approx(1.0 + np.cos(np.pi / 2 + beta))
    assert y == pytest.approx(2.0 + np.sin(np.pi / 2 + beta))
    assert h == pytest.approx(np.pi / 2 + 10.0 / 1.5 * np.sin(beta) * 0.1)
    # The steering limit, no reversing, and the heading wrapped to (-pi, pi].
    limited = bicycle_step(0.0, 0.0, 3.1, 10.0, -200.0, 2.0, 0.1, p)
    unlimited = bicycle_step(0.0, 0.0, 3.1, 10.0, -200.0, 0.5, 0.1, p)
    np.testing.assert_allclose(limited, unlimited)
    assert limited[3] == 0.0 and -np.pi < limited[2] <= np.pi and limited[2] < 0
    np.testing.assert_allclose(wrap_angle(np.array([np.pi, -np.pi, 3 * np.pi / 2])),
                               [np.pi, np.pi, -np.pi / 2])  # fmt: skip


def test_routes_enter_and_leave_on_the_right_lanes():
    layout = Layout(lane_width=3.5, arm_length=50.0, corner=5.0)
    routes = build_routes(layout)
    h, far, w = layout.half, layout.half + layout.arm_length, layout.lane_width
    assert len(routes.keys) == 4 * 4  # per arm: straight from both lanes, left, right
    assert not route_allowed(0, "right") and not route_allowed(1, "left")
    south_left = routes.index(0, 0, "left")
    pts = routes.points[south_left, : routes.count[south_left]]
    np.testing.assert_allclose(pts[0], [w / 2, -far])  # northbound, next to the centre line
    np.testing.assert_allclose(pts[-1], [-far, w / 2], atol=1e-9)  # westbound, left lane
    east_right = routes.index(1, 1, "right")  # from the east arm, kerb lane: into the north arm
    pts = routes.points[east_right, : routes.count[east_right]]
    np.testing.assert_allclose(pts[0], [far, 1.5 * w], atol=1e-9)
    np.testing.assert_allclose(pts[-1], [1.5 * w, far], atol=1e-9)
    straight = routes.index(2, 1, "straight")
    assert routes.length[straight] == pytest.approx(2 * far)
    left_len = 2 * layout.arm_length + np.pi / 2 * (h + w / 2)
    assert routes.length[south_left] == pytest.approx(left_len, rel=1e-3)
    steps = np.linalg.norm(np.diff(routes.points, axis=1), axis=-1)
    assert steps.max() <= layout.spacing + 1e-9  # no jumps: every route is continuous


def test_projection_onto_routes():
    routes = build_routes(Layout())
    r = routes.index(0, 1, "straight")  # northbound, kerb lane at x = 5.25
    route = np.array([r, r, r])
    pos = np.array([[5.25, -20.0], [4.25, -20.0], [6.25, 0.0]])  # on it, 1 m left, 1 m right
    s, d, heading = project(routes, route, pos)
    start = -(Layout().half + Layout().arm_length)
    np.testing.assert_allclose(s, [-20.0 - start, -20.0 - start, -start])
    np.testing.assert_allclose(d, [0.0, 1.0, -1.0], atol=1e-9)
    np.testing.assert_allclose(heading, np.pi / 2)
    back, back_heading = point_at(routes, route, s)
    np.testing.assert_allclose(back, [[5.25, -20.0], [5.25, -20.0], [5.25, 0.0]], atol=1e-9)
    np.testing.assert_allclose(back_heading, np.pi / 2)
    # On a left turn's arc, halfway round: heading north-west, offset 0.
    left = routes.index(0, 0, "left")
    h, w = Layout().half, Layout().lane_width
    mid = np.array([[-h + (h + w / 2) * np.cos(np.pi / 4), -h + (h + w / 2) * np.sin(np.pi / 4)]])
    s, d, heading = project(routes, np.array([left]), mid)
    assert abs(d[0]) < 0.01 and heading[0] == pytest.approx(3 * np.pi / 4, abs=0.05)
