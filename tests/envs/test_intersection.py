"""``shoal/intersection-v0``: spaces and observation layout, completion, collision and
leaving the road with their masking, batch rows equal to single envs, exact state round
trips, and MAPPO on it."""

import importlib.util

import numpy as np
import pytest
from traffic import entering_on_red

import shoal
from shoal.config import EnvConfig
from shoal.core.errors import ConfigError
from shoal.envs.intersection import IntersectionEnv
from shoal.envs.intersection.env import OBS_DIM
from shoal.envs.intersection.observations import NEIGHBOUR_DIM
from shoal.envs.make import make_multi_agent_env

KEEP = 0


def keep_lane(n):
    return {"agent": np.full((n, 4), KEEP)}


def test_spaces_and_observations():
    env = IntersectionEnv(3, traffic="high", background=8, seed=0)
    obs, state = env.reset(seed=0)
    assert obs["agent"].shape == (3, 4, OBS_DIM) and state.shape == (3, 12 * 6)
    for _ in range(40):
        step = env.step(keep_lane(3))
    o = step.obs["agent"]
    neighbours = o[..., 8:].reshape(3, 4, 8, NEIGHBOUR_DIM)
    seen = neighbours[..., 4] > 0
    distances = neighbours[..., 2]
    for b in range(3):
        for i in range(4):
            d = distances[b, i][seen[b, i]]
            assert (np.diff(d) >= 0).all()  # nearest first
            assert not neighbours[b, i][~seen[b, i]].any()  # zeros past the last
            rel = neighbours[b, i, seen[b, i], :2] * 50.0
            np.testing.assert_allclose(np.hypot(rel[:, 0], rel[:, 1]), d * 50.0, rtol=1e-4)
    with pytest.raises(ConfigError, match="traffic must be one of"):
        IntersectionEnv(1, traffic="rush hour")
    with pytest.raises(ConfigError, match="outside"):
        IntersectionEnv(1, traffic=500.0)


def test_neighbours_are_seen_with_their_velocity_relative_to_the_agent():
    """Worked by hand: agent 0 heads north at 8 m/s; a car 20 m north and 10 m east of it
    heads west at 5 m/s. In the agent's frame (x ahead, y left) it is 20 ahead, 10 to the
    right, and moves at (-5, 0) - (0, 8) in the world = 8 m/s towards the agent and 5 m/s
    to its left."""
    env = IntersectionEnv(1, traffic="none", routes="fixed", seed=0)
    env.reset(seed=0)
    vehicles = env.vehicles
    vehicles.present[0, 1:] = False
    vehicles.heading[0, 0], vehicles.speed[0, 0] = np.pi / 2, 8.0
    vehicles.pos[0, 4] = vehicles.pos[0, 0] + [10.0, 20.0]
    vehicles.heading[0, 4], vehicles.speed[0, 4], vehicles.present[0, 4] = np.pi, 5.0, True
    near = env.observe()[0]["agent"][0, 0, 8 : 8 + NEIGHBOUR_DIM]
    want = [20 / 50, -10 / 50, np.hypot(10, 20) / 50, 5 / 10, 1.0, -8 / 10, 5 / 10]
    np.testing.assert_allclose(near, want, atol=1e-6)


def test_occupancy_grid_marks_road_and_the_vehicle_ahead():
    env = IntersectionEnv(1, traffic="none", routes="fixed", grid=8, grid_cell=2.0, seed=0)
    obs, _ = env.reset(seed=0)
    assert obs["agent"].shape == (1, 4, OBS_DIM + 2 * 64)
    # Agent 0 drives north in the kerb lane at x = 5.25, 15 m into the south arm (y = -47).
    vehicles = env.vehicles
    vehicles.present[0, 1:] = False
    vehicles.pos[0, 4], vehicles.heading[0, 4], vehicles.present[0, 4] = (
        vehicles.pos[0, 0] + [0.0, 5.0],
        np.pi / 2,
        True,
    )
    grid = env.observe()[0]["agent"][0, 0, OBS_DIM:].reshape(2, 8, 8)
    # A vehicle 5 m ahead: its discs 3.75 and 6.25 m ahead, cells 5 and 7 ahead, lateral 0 (4).
    assert grid[1].sum() == 2 and grid[1, 5, 4] == 1 and grid[1, 7, 4] == 1
    # Road: the arm is 7 m wide each side of x = 0; the agent at x = 5.25 sees its right
    # kerb 1.75 m to its right (cells j < 3 at 3 m and more are off the road), the rest is road.
    assert grid[0][:, 3:].all() and not grid[0][:, :3].any()


def test_frames_stack_the_last_observations():
    env = IntersectionEnv(2, traffic="low", frames=3, seed=1)
    plain = IntersectionEnv(2, traffic="low", seed=1)
    obs, _ = env.reset(seed=1)
    single, _ = plain.reset(seed=1)
    history = [single["agent"]] * 3  # a new episode repeats its first observation
    rng = np.random.default_rng(0)
    for _ in range(400):
        np.testing.assert_allclose(obs["agent"], np.concatenate(history[-3:], -1), atol=1e-6)
        a = {"agent": rng.integers(2, size=(2, 4))}
        step, want = env.step(a), plain.step(a)
        obs = step.obs
        history.append(want.obs["agent"])
        for b in np.flatnonzero(want.autoreset):
            for k in (-3, -2):
                history[k] = history[k].copy()
                history[k][b] = want.obs["agent"][b]
    with pytest.raises(ConfigError, match="frames"):
        IntersectionEnv(1, frames=0)
    with pytest.raises(ConfigError, match="grid"):
        IntersectionEnv(1, grid=2)
    assert IntersectionEnv(1, signals="false").scenario.signals is False  # text from a CLI
    assert IntersectionEnv(1, continuous="True").scenario.continuous is True
    with pytest.raises(ConfigError, match="true or false"):
        IntersectionEnv(1, signals="maybe")


def test_signals_stop_the_traffic_on_red_and_cost_agents_that_run_it():
    env = IntersectionEnv(16, traffic="high", signals=True, seed=0)
    obs, state = env.reset(seed=0)
    assert obs["agent"].shape == (16, 4, OBS_DIM + 1) and state.shape == (16, 16 * 6 + 4)
    lights = env.lights()
    assert ((lights[:, 0] == lights[:, 2]) & (lights[:, 1] == lights[:, 3])).all()
    assert (np.minimum(lights[:, 0], lights[:, 1]) == 0).all()  # never both roads open
    arm = env.scenario.route_arm[env.vehicles.route[:, :4]]
    np.testing.assert_array_equal(obs["agent"][..., -1], np.take_along_axis(lights, arm, 1) / 2)
    on_red, entered = entering_on_red(env, 400, {"agent": np.ones((16, 4), np.int64)})
    assert entered > 50 and on_red == 0
    # An agent alone, its light red, driving on: -5 once as it enters the box.
    env = IntersectionEnv(1, traffic="none", routes="fixed", signals=True, seed=0)
    env.reset(seed=0)
    env.signal_offset[:] = 16.0  # east-west green for 15 s: the south arm's light is red
    rewards = [env.step(keep_lane(1)).rewards["agent"][0, 0] for _ in range(45)]
    assert sum(r < -4.0 for r in rewards) == 1


def test_completion_is_rewarded_and_then_masked():
    env = IntersectionEnv(1, traffic="none", seed=0)
    env.reset(seed=0)
    right_turns = np.array([env.scenario.routes.index(i, 1, "right") for i in range(4)])
    env.vehicles.place(np.zeros(4, np.int64), np.arange(4), right_turns, np.full(4, 15.0), 8.0)
    total, finished_at = np.zeros(4), {}
    for t in range(250):
        step = env.step(keep_lane(1))
        total += step.rewards["agent"][0]
        for i in np.flatnonzero(step.terminated["agent"][0]):
            finished_at[i] = t
            assert step.rewards["agent"][0, i] > 9.0  # the completion bonus
        for i, t_done in finished_at.items():
            if t > t_done and not step.autoreset[0]:
                assert not step.active["agent"][0, i] and step.rewards["agent"][0, i] == 0
        if step.episode_info is not None:
            step_info = step.episode_info
        if step.autoreset[0]:
            break
    assert set(finished_at) == {0, 1, 2, 3}  # right turns never cross: all complete
    info = step_info  # the step that ended the episode reports its statistics
    assert info["completion_rate"].tolist() == [1.0] and info["collision_rate"].tolist() == [0.0]
    finish = np.array([finished_at[i] + 1 for i in range(4)]) * 0.1
    assert info["time_to_complete"][0] == pytest.approx(finish.mean())
    # Progress (0.1 per metre from 15 m into the arm to within 3 m of the end) plus the bonus.
    lengths = env.scenario.routes.length[right_turns]
    assert ((total > 0.1 * (lengths - 18.0) + 10.0) & (total < 0.1 * (lengths - 15.0) + 10.0)).all()


def test_collisions_end_both_agents_and_leaving_the_road_is_penalised():
    env = IntersectionEnv(1, traffic="none", routes="fixed", continuous=True, seed=0)
    env.reset(seed=0)
    route = env.vehicles.route[0, :1]  # agent 1 moved onto agent 0's route, 1 m ahead of it
    env.vehicles.place(np.zeros(1, np.int64), np.ones(1, np.int64), route, np.full(1, 16.0), 8.0)
    hard_left = np.zeros((1, 4, 3))
    hard_left[0, 3] = [1.0, 0.0, 1.0]  # agent 3: full throttle, full left steering
    collided = np.zeros(4, bool)
    off = False
    for _ in range(60):
        step = env.step({"agent": hard_left})
        r = step.rewards["agent"][0]
        crash = (r < -9.0) & step.terminated["agent"][0]
        if crash.any():
            assert not env.vehicles.present[0, np.flatnonzero(crash)].any()  # off the road
        collided |= crash
        off |= bool(step.terminated["agent"][0, 3] and r[3] < -4.0)
    assert collided[0] and collided[1] and not collided[3]
    assert off


def test_batch_rows_equal_single_envs():
    """Without traffic nothing is random after the reset: env b of a batch steps as a
    one-env batch with env b's routes does."""
    batch = IntersectionEnv(3, traffic="none", seed=5)
    batch.reset(seed=5)
    rng = np.random.default_rng(0)
    actions = [rng.integers(4, size=(3, 4)) for _ in range(80)]
    singles = []
    for b in range(3):
        single = IntersectionEnv(1, traffic="none", seed=5)
        single.reset(seed=5)
        single.vehicles.route[0] = batch.vehicles.route[b]
        single.vehicles.place(
            np.zeros(4, np.int64), np.arange(4), batch.vehicles.route[b, :4], np.full(4, 15.0), 8.0
        )
        singles.append(single)
    for a in actions:
        got = batch.step({"agent": a})
        for b, single in enumerate(singles):
            want = single.step({"agent": a[b : b + 1]})
            np.testing.assert_allclose(got.obs["agent"][b], want.obs["agent"][0], atol=1e-5)
            np.testing.assert_array_equal(got.rewards["agent"][b], want.rewards["agent"][0])


def test_decisions_hold_the_action_for_several_simulator_steps():
    """With ``decision_steps=5`` one step is five 0.1 s simulator steps under the same
    action: the same vehicles' poses as five steps of the plain env, the rewards summed, the
    agents that finished in any of them terminated; the 30 s limit still counts simulator
    steps (60 decisions)."""
    held = IntersectionEnv(1, traffic="none", routes="fixed", decision_steps=5, seed=4)
    plain = IntersectionEnv(1, traffic="none", routes="fixed", seed=4)
    held.reset(seed=4)
    plain.reset(seed=4)
    rng = np.random.default_rng(0)
    outcomes = set()
    for _ in range(60):
        action = {"agent": (rng.random((1, 4)) < 0.2).astype(np.int64)}  # slow down at times
        got = held.step(action)
        steps = []
        while len(steps) < 5 and (not steps or steps[-1].episode_info is None):
            steps.append(plain.step(action))  # up to the episode's end
        np.testing.assert_allclose(got.obs["agent"], steps[-1].obs["agent"], atol=1e-6)
        summed = sum(step.rewards["agent"].astype(np.float64) for step in steps)
        np.testing.assert_allclose(got.rewards["agent"], summed, atol=1e-4)
        finished = np.any([step.terminated["agent"] for step in steps], axis=0)
        np.testing.assert_array_equal(got.terminated["agent"], finished)
        outcomes.update(held.outcome[0].tolist())
        if got.episode_info is not None:
            for key, value in got.episode_info.items():
                np.testing.assert_allclose(value, steps[-1].episode_info[key])
            break
    else:
        raise AssertionError("the episode did not end")
    assert 1 in outcomes  # some agents completed on the way
    waiting = IntersectionEnv(1, traffic="none", decision_steps=5, seed=0)
    waiting.reset(seed=0)
    for decision in range(1, 61):
        step = waiting.step({"agent": np.ones((1, 4), np.int64)})  # slow down, forever
        assert step.truncated["agent"].any() == (decision == 60), decision
    assert waiting.metadata["render_fps"] == 2 and IntersectionEnv(1).metadata["render_fps"] == 10
    with pytest.raises(ConfigError, match="decision_steps"):
        IntersectionEnv(1, decision_steps=0)


def test_state_round_trip_is_exact():
    env = IntersectionEnv(4, traffic="high", seed=3)
    env.reset(seed=3)
    rng = np.random.default_rng(1)
    for _ in range(30):
        env.step({"agent": rng.integers(4, size=(4, 4))})
    saved = env.get_state()
    actions = [rng.integers(4, size=(4, 4)) for _ in range(120)]
    first = [env.step({"agent": a}) for a in actions]
    env.set_state(saved)
    second = [env.step({"agent": a}) for a in actions]
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(a.obs["agent"], b.obs["agent"])
        np.testing.assert_array_equal(a.rewards["agent"], b.rewards["agent"])
        np.testing.assert_array_equal(a.state, b.state)


@pytest.mark.parametrize("algo", ["mappo", "maddpg"])
def test_learners_train_on_it_and_log_the_traffic_statistics(algo, tmp_path):
    seen = []
    settings = {"num_steps": 32, "minibatch_size": 256, "num_epochs": 1}
    if algo == "maddpg":
        settings = {"rollout_steps": 8, "replay.batch_size": 64, "replay.learning_starts": 64}
    shoal.train(
        algo,
        run_dir=str(tmp_path / algo),
        total_steps=2 * 8 * 32,
        on_iteration=lambda step, metrics: seen.append(metrics),
        **{"env.id": "shoal/intersection-v0", "env.num_envs": 8, "env.max_episode_steps": 20,
           "model.hidden": (16,), "run.eval_every_steps": 0, "run.console": False,
           "run.tensorboard": False, **settings},
    )  # fmt: skip
    logged = {key for m in seen for key in m}
    assert {"episode/completion_rate", "episode/collision_rate", "episode/off_road_rate"} <= logged
    assert any(key.startswith("loss/") for key in logged)
    frame = IntersectionEnv(1, traffic="high", seed=0)
    frame.reset(seed=0)
    for _ in range(30):  # background cars enter
        frame.step({"agent": np.zeros((1, 4), np.int64)})
    image = frame.render()
    assert image.shape == (480, 480, 3) and image.dtype == np.uint8
    # The learning agents stand out: each in its colour inside a white halo, the background
    # traffic dark grey.
    pixels = image.reshape(-1, 3)
    assert (pixels == (255, 255, 255)).all(1).sum() > 100  # the halos, about 4 pixels a metre
    assert (pixels == (220, 60, 60)).all(1).sum() > 20  # agent 0's colour
    assert (pixels == (40, 40, 40)).all(1).any()  # high traffic: other cars


def test_bad_options_backends_and_missing_simulators_are_clear_errors(monkeypatch):
    def make(env_id="shoal/intersection-v0", **kwargs):
        return make_multi_agent_env(EnvConfig(id=env_id, kwargs=kwargs))

    with pytest.raises(ConfigError, match="backend must be one of"):
        make(backend="carla")
    with pytest.raises(ConfigError, match="bad env.kwargs.*lidar"):
        make(lidar=True)  # an observation option that does not exist
    with pytest.raises(ConfigError, match="outside"):
        make(traffic=-3)
    real = importlib.util.find_spec
    missing = {"libsumo", "smarts"}
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name in missing else real(name, *a)
    )
    with pytest.raises(ConfigError, match=r"pip install 'shoal\[sumo\]'"):
        make(backend="sumo")
    with pytest.raises(ConfigError, match=r"pip install 'shoal\[smarts\]'"):
        make("shoal/smarts-intersection-v0")
