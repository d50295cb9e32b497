"""``shoal/smarts-intersection-v0``: the SMARTS adapter has the built-in intersection's spaces,
plays episodes with its metrics, and runs end to end: a few hundred training steps, an
evaluation and a video from the command line."""

import importlib.util

import numpy as np
import pytest

import shoal
from shoal.cli import main
from shoal.config import EnvConfig
from shoal.core.errors import ConfigError
from shoal.envs.heuristics import IntersectionHeuristic
from shoal.envs.intersection import IntersectionEnv
from shoal.envs.make import make_multi_agent_env
from shoal.envs.multi_agent import episode_ended

if importlib.util.find_spec("smarts") is None:
    pytest.skip("SMARTS is not installed: pip install 'shoal[smarts]'", allow_module_level=True)

# SMARTS runs SUMO in a process of its own: in the Ray tests' worker, it never loads the cores
# under their timing-dependent learning tests (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("ray")


def make(**kwargs):
    config = EnvConfig(id="shoal/smarts-intersection-v0", num_envs=1, kwargs=kwargs)
    return make_multi_agent_env(config)


def test_spaces_and_an_episode_with_its_metrics():
    env = make(traffic="high")
    built_in = IntersectionEnv(1, traffic="high")
    assert env.groups == built_in.groups and env.state_space == built_in.state_space
    obs, state = env.reset(seed=0)
    assert obs["agent"].shape == (1, 4, 64) and state.shape == (1, 16 * 6)
    # Each agent starts 15 m into its arm, heading into the box, on its lane's centre.
    distance = np.hypot(
        *env.vehicles.pos[0, :4].T
    )  # 47 m from the centre, lane 1.75 or 5.25 m aside
    assert ((distance > 46.0) & (distance < 48.5)).all(), distance
    assert np.abs(obs["agent"][0, :, 2]).max() < 0.2  # distance to the lane centre, m
    group = env.groups["agent"]
    heuristic = IntersectionHeuristic(group.observation_space, group.action_space)
    info, seen = None, 0
    for _ in range(300):
        step = env.step({"agent": heuristic.act(obs["agent"])})
        obs = step.obs
        seen = max(seen, int(env.vehicles.present[0, 4:].sum()))
        if step.episode_info is not None:
            info = step.episode_info
            break
    assert info is not None and seen > 0  # the episode ended, among background traffic
    rates = info["completion_rate"][0] + info["collision_rate"][0] + info["off_road_rate"][0]
    assert 0.0 < rates <= 1.0
    assert episode_ended(step)[0]  # every agent finished, was cut off, or was already done
    env.close()


def test_trains_evaluates_and_records_a_video(tmp_path, capsys):
    run_dir = tmp_path / "run"
    shoal.train(
        "mappo",
        run_dir=str(run_dir),
        total_steps=256,
        **{"env.id": "shoal/smarts-intersection-v0", "env.num_envs": 1,
           "env.kwargs": {"traffic": "low"}, "env.max_episode_steps": 100, "num_steps": 128,
           "minibatch_size": 128, "num_epochs": 1, "model.hidden": (16,),
           "run.eval_every_steps": 0, "run.eval_episodes": 1, "run.console": False,
           "run.tensorboard": False},
    )  # fmt: skip
    video = tmp_path / "smarts.gif"
    assert main(["eval", str(run_dir), "--episodes", "1", "--video", str(video)]) == 0
    out = capsys.readouterr().out
    assert "1 episodes on shoal/smarts-intersection-v0" in out and "collision_rate" in out
    assert video.exists() and video.stat().st_size > 0


def test_built_in_only_options_are_refused():
    with pytest.raises(ConfigError, match="built-in only"):
        make(signals=True)
