"""Dict and Tuple observations end to end: every algorithm family on `shoal/GoalLine-v0`
(a Dict of a position and a goal, both needed), learning, exact resume and deployment."""

import gymnasium as gym
import numpy as np
import pytest

import shoal
from shoal.core.errors import ShoalError
from shoal.envs.goal_line import ENV_ID, STOP
from shoal.train.checkpoint import load_checkpoint
from tests.state_helpers import assert_states_equal, metric_rows

QUIET = {"run.console": False, "run.tensorboard": False, "run.checkpoint_every_steps": 0}
CONTINUOUS = {"env.kwargs": {"continuous": True}}
SMALL_REPLAY = {"replay.learning_starts": 64, "replay.batch_size": 32}


@pytest.mark.parametrize(
    "algo, extra",
    [
        ("ppo", {"env.num_envs": 4, "num_steps": 16, "minibatch_size": 32}),
        (
            "ppo",
            {"env.num_envs": 4, "num_steps": 16, "minibatch_size": 32, "model.backend": "torch"},
        ),
        ("a2c", {"env.num_envs": 4}),
        ("pg", {"env.num_envs": 4}),
        ("trpo", {"env.num_envs": 4}),
        ("impala", {"env.num_envs": 4}),
        ("dqn", SMALL_REPLAY),
        ("dqn", {**SMALL_REPLAY, "value_head": "c51"}),
        ("sac", {**SMALL_REPLAY, **CONTINUOUS}),
        ("sac", SMALL_REPLAY),  # discrete SAC
        ("td3", {**SMALL_REPLAY, **CONTINUOUS}),
        ("ddpg", {**SMALL_REPLAY, **CONTINUOUS}),
        ("d4pg", {**SMALL_REPLAY, **CONTINUOUS}),
        (
            "ppo",
            {"env.num_envs": 4, "num_steps": 16, "minibatch_size": 32, "model.lstm_hidden": 16},
        ),
    ],
)
def test_every_family_trains_on_dict_observations(algo, extra, tmp_path):
    result = shoal.train(
        algo,
        env=ENV_ID,
        seed=0,
        total_steps=256,
        run_dir=str(tmp_path / "run"),
        **{"run.eval_every_steps": 256, "run.eval_episodes": 2, **QUIET, **extra},
    )
    assert result.env_steps >= 256 and np.isfinite(result.eval_return)
    policy = shoal.load(result.run_dir)
    continuous = extra.get("env.kwargs") == {"continuous": True}
    goal = np.array([0.5], np.float32) if continuous else 3
    action = policy.act({"pos": np.array([0.0], np.float32), "goal": goal})
    assert np.shape(action) == ((1,) if continuous else ())


def test_ppo_learns_a_task_that_needs_both_keys(tmp_path):
    result = shoal.train(
        "ppo",
        env=ENV_ID,
        seed=0,
        total_steps=30_000,
        run_dir=str(tmp_path / "run"),
        **{"run.eval_every_steps": 10_000, "run.eval_episodes": 20, **QUIET},
    )
    # Reading one key earns at most ~0.2 (a random stop is right 1 time in 5).
    assert result.eval_return >= 0.9
    policy = shoal.load(result.run_dir)
    pos = np.linspace(-1.0, 1.0, 5, dtype=np.float32)[:, None]
    goals = np.full(5, 2)  # goal in the middle: go right, right, stop, left, left
    actions = policy.act({"pos": pos, "goal": goals})
    np.testing.assert_array_equal(actions, [1, 1, STOP, 0, 0])


def test_dqn_learns_a_task_that_needs_both_keys(tmp_path):
    result = shoal.train(
        "dqn",
        env=ENV_ID,
        seed=0,
        total_steps=8_000,
        run_dir=str(tmp_path / "run"),
        **{
            "exploration_steps": 3_000,
            "target_update_every": 200,
            "replay.learning_starts": 500,
            "run.eval_every_steps": 8_000,
            "run.eval_episodes": 20,
            **QUIET,
        },
    )
    assert result.eval_return >= 0.8


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_resume_on_dict_observations_is_exact(algo, tmp_path):
    extra = {
        "env.normalize_obs": True,
        "run.checkpoint_every_steps": 128,
        "run.eval_every_steps": 0,
    }
    if algo == "dqn":
        extra.update({**SMALL_REPLAY, "replay.save": True})
    else:
        extra.update({"env.num_envs": 4, "num_steps": 16, "minibatch_size": 32})
    common = {**QUIET, **extra}
    part = shoal.train(
        algo, env=ENV_ID, seed=3, total_steps=256, run_dir=str(tmp_path / "a"), **common
    )
    resumed = shoal.train(resume=part.run_dir, total_steps=512)
    straight = shoal.train(
        algo, env=ENV_ID, seed=3, total_steps=512, run_dir=str(tmp_path / "b"), **common
    )
    got, want = load_checkpoint(resumed.run_dir).state, load_checkpoint(straight.run_dir).state
    assert_states_equal(got["algorithm"], want["algorithm"])
    assert metric_rows(resumed.run_dir) == metric_rows(straight.run_dir)


class ImageDictEnv(gym.Env):
    """A Dict of a uint8 image and a float vector: the action that pays is the image's
    brightest of 3 columns."""

    observation_space = gym.spaces.Dict(
        {
            "frame": gym.spaces.Box(0, 255, (1, 36, 36), np.uint8),
            "vec": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
        }
    )
    action_space = gym.spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def _obs(self):
        self.target = int(self.np_random.integers(3))
        frame = np.zeros((1, 36, 36), np.uint8)
        frame[0, :, 12 * self.target : 12 * self.target + 12] = 255
        return {"frame": frame, "vec": self.np_random.uniform(-1, 1, 2).astype(np.float32)}

    def step(self, action):
        self.t += 1
        reward = float(int(action) == self.target)
        return self._obs(), reward, False, self.t >= 8, {}


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_image_parts_use_an_image_encoder_and_stay_uint8(algo, tmp_path, registered_env):
    env_id = registered_env("test/ImageDict-v0", ImageDictEnv)
    extra = (
        SMALL_REPLAY
        if algo == "dqn"
        else {"env.num_envs": 2, "num_steps": 16, "minibatch_size": 16}
    )
    result = shoal.train(
        algo, env=env_id, seed=0, total_steps=64, run_dir=str(tmp_path / "run"), **QUIET, **extra
    )
    policy = shoal.load(result.run_dir)
    body = policy.model.encoding.composite
    assert type(body.encoders[0]).__name__ == "ImageEncoder"
    # Stored as records of one byte a pixel plus the float vector: 1296 + 8 bytes a step.
    space = policy.observation_space
    assert space.leaves[0].dtype == np.uint8 and space.record_bytes == 1296 + 8
    frame = np.zeros((1, 36, 36), np.uint8)
    assert policy.act({"frame": frame, "vec": np.zeros(2, np.float32)}) in (0, 1, 2)


def test_act_refuses_a_dict_missing_a_key(tmp_path):
    result = shoal.train(
        "ppo",
        env=ENV_ID,
        total_steps=64,
        run_dir=str(tmp_path / "run"),
        **{"env.num_envs": 4, "num_steps": 16, "minibatch_size": 32, **QUIET},
    )
    with pytest.raises(ShoalError, match="no part 'goal'"):
        shoal.load(result.run_dir).act({"pos": np.zeros(1, np.float32)})


def test_frame_replay_on_dict_observations_is_a_clear_error(tmp_path):
    from shoal.core.errors import ConfigError

    with pytest.raises(ConfigError, match="Dict and Tuple observations are stored as packed"):
        shoal.train(
            "dqn", env=ENV_ID, run_dir=str(tmp_path / "run"), **{"frame_replay": True, **QUIET}
        )
    assert not (tmp_path / "run").exists()


def test_ray_runners_carry_dict_observations(tmp_path, ray_session):
    """Packed records travel from Ray runners like any observation array."""
    result = shoal.train(
        "ppo",
        env=ENV_ID,
        seed=0,
        total_steps=512,
        run_dir=str(tmp_path / "run"),
        **{
            "run.runners": 2,
            "env.num_envs": 2,
            "num_steps": 32,
            "minibatch_size": 64,
            "run.eval_every_steps": 512,
            "run.eval_episodes": 2,
            **QUIET,
        },
    )
    assert result.env_steps >= 512 and np.isfinite(result.eval_return)
    policy = shoal.load(result.run_dir)
    assert policy.act({"pos": np.array([0.0], np.float32), "goal": 1}) in (0, 1, 2)
