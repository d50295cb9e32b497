"""The SUMO backend of ``shoal/intersection-v0``: the network netconvert builds is the
built-in layout, the backend steps with the built-in spaces and metrics, agrees with the
built-in simulator on fixed routes, runs envs in worker processes, trains, and says what to
install when SUMO is missing."""

import importlib.util
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from traffic import entering_on_red

import shoal
from shoal.config import EnvConfig
from shoal.envs.heuristics import IntersectionHeuristic
from shoal.envs.intersection import IntersectionEnv
from shoal.envs.intersection.env import OBS_DIM, make_intersection
from shoal.envs.snapshot import EnvStateUnsupported

if importlib.util.find_spec("libsumo") is None:
    pytest.skip("Eclipse SUMO is not installed: pip install 'shoal[sumo]'", allow_module_level=True)

from shoal.envs.intersection.network import build_network  # noqa: E402
from shoal.envs.intersection.sumo import SumoSimulator  # noqa: E402

# SUMO runs in worker processes: in the Ray tests' worker, they never load the cores under the
# Ray tests' timing-dependent learning tests (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("ray")


def make(num_envs=1, **kwargs):
    config = EnvConfig(
        id="shoal/intersection-v0", num_envs=num_envs, kwargs={"backend": "sumo", **kwargs}
    )
    return make_intersection(config)


def test_the_network_is_the_built_in_layout(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    net, routes = build_network(IntersectionEnv(1).scenario)
    assert net.is_relative_to(tmp_path)
    lanes = {lane.get("id"): lane.get("shape") for lane in ET.parse(net).iter("lane")}
    # Kerb lane (SUMO's 0) 5.25 m and left lane 1.75 m right of the centre line, the box's
    # edge 12 m from the centre, the arm's end 62 m out: the built-in geometry.
    assert lanes["S_in_0"] == "5.25,-62.00 5.25,-12.00"
    assert lanes["S_in_1"] == "1.75,-62.00 1.75,-12.00"
    assert lanes["E_out_0"] == "12.00,-5.25 62.00,-5.25"
    route_ids = [r.get("id") for r in ET.parse(routes).iter("route")]
    assert len(route_ids) == len(IntersectionEnv(1).scenario.routes.keys) == 16
    assert build_network(IntersectionEnv(1).scenario) == (net, routes)  # cached


@pytest.mark.parametrize("policy", ["keep_lane", "heuristic"])
def test_agrees_with_the_built_in_simulator_on_fixed_routes(policy):
    """Without traffic, on the fixed routes, both backends end each agent's episode the
    same way (the same agents collide and complete) and within 0.3 s of each other."""
    ends = []
    for env in (IntersectionEnv(1, traffic="none", routes="fixed"),
                make(traffic="none", routes="fixed")):  # fmt: skip
        group = env.groups["agent"]
        heuristic = IntersectionHeuristic(group.observation_space, group.action_space)
        obs, _ = env.reset(seed=0)
        for _ in range(300):
            if policy == "heuristic":
                actions = heuristic.act(obs["agent"])
            else:
                actions = np.zeros((1, 4), np.int64)
            step = env.step({"agent": actions})
            obs = step.obs
            if step.episode_info is not None:
                break
        ends.append((env.outcome[0].copy(), env.finish_time[0].copy(), step.episode_info))
        env.close()
    (built_in, t_built_in, info), (sumo, t_sumo, sumo_info) = ends
    np.testing.assert_array_equal(built_in, sumo)
    assert {1, 2} <= set(sumo.tolist())  # some complete, some collide
    np.testing.assert_allclose(t_built_in, t_sumo, atol=0.3)
    assert set(info) == set(sumo_info)


def test_worker_processes_step_like_the_in_process_simulation():
    """Two envs in worker processes give what one in-process env gives (no traffic: the
    same fixed routes in both)."""
    single = make(traffic="none", routes="fixed")
    batch = make(2, traffic="none", routes="fixed")
    assert isinstance(batch.sim, SumoSimulator) and len(batch.sim._sims) == 2
    single.reset(seed=0)
    batch.reset(seed=0)
    rng = np.random.default_rng(0)
    for _ in range(60):
        a = rng.integers(2, size=(1, 4))
        got, want = batch.step({"agent": np.repeat(a, 2, 0)}), single.step({"agent": a})
        for b in range(2):
            np.testing.assert_allclose(got.obs["agent"][b], want.obs["agent"][0], atol=1e-5)
            np.testing.assert_array_equal(got.rewards["agent"][b], want.rewards["agent"][0])
    with pytest.raises(EnvStateUnsupported):
        batch.get_state()
    batch.close()
    single.close()


def test_traffic_enters_moves_and_leaves():
    env = make(2, traffic="high", continuous=True)
    obs, state = env.reset(seed=1)
    assert obs["agent"].shape == (2, 4, OBS_DIM) and state.shape == (2, 16 * 6)
    seen, moved = 0, False
    rng = np.random.default_rng(0)
    for _ in range(300):
        vehicles = env.vehicles
        before = vehicles.pos[:, 4:].copy()
        env.step({"agent": rng.uniform([0, 0, -0.2], [1, 0.2, 0.2], (2, 4, 3))})
        seen = max(seen, int(vehicles.present[:, 4:].sum()))
        shift = np.abs(vehicles.pos[:, 4:] - before).sum(-1)
        moved |= bool((shift[vehicles.present[:, 4:]] > 0.1).any())
    assert seen >= 2 and moved
    env.close()


def test_signals_hold_sumo_traffic_on_red():
    env = make(2, traffic="high", signals=True)
    obs, state = env.reset(seed=0)
    assert obs["agent"].shape == (2, 4, OBS_DIM + 1) and state.shape == (2, 16 * 6 + 4)
    on_red, entered = entering_on_red(env, 400, {"agent": np.ones((2, 4), np.int64)})
    assert entered > 5 and on_red == 0
    env.close()


def test_mappo_trains_on_sumo_and_resumes_with_fresh_episodes(tmp_path):
    seen = []
    settings = {
        "env.id": "shoal/intersection-v0", "env.num_envs": 2, "env.max_episode_steps": 40,
        "env.kwargs": {"backend": "sumo"}, "num_steps": 32, "minibatch_size": 64,
        "num_epochs": 1, "model.hidden": (16,), "run.eval_every_steps": 0,
        "run.console": False, "run.tensorboard": False,
    }  # fmt: skip
    shoal.train("mappo", run_dir=str(tmp_path / "run"), total_steps=128,
                on_iteration=lambda step, metrics: seen.append(metrics), **settings)  # fmt: skip
    logged = {key for m in seen for key in m}
    assert {"episode/completion_rate", "episode/collision_rate"} <= logged
    assert any(key.startswith("loss/") for key in logged)
    resumed = shoal.train(resume=tmp_path / "run", total_steps=256)
    assert resumed.env_steps >= 256
