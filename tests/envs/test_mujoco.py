"""Gymnasium's MuJoCo v5 envs through shoal (the mujoco extra), rendered headless with EGL."""

import os
import sys

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("mujoco", reason="needs the mujoco extra: pip install 'shoal[mujoco]'")

import shoal  # noqa: E402
from shoal.cli import main  # noqa: E402
from shoal.config import EnvConfig  # noqa: E402
from shoal.envs import make_env  # noqa: E402
from shoal.train.video import record_video  # noqa: E402

# Debian/Ubuntu packages that headless EGL rendering needs on a machine without a GPU driver:
# the GLVND loaders (libegl1, libopengl0) and Mesa's EGL vendor with its software rasterizer.
EGL_PACKAGES = "libegl1 libopengl0 libegl-mesa0 libgl1-mesa-dri"


@pytest.fixture(scope="module")
def egl_rendering():
    """Render one HalfCheetah frame with MUJOCO_GL=egl; skip when the machine cannot."""
    if not sys.platform.startswith("linux"):
        pytest.skip("shoal defaults MUJOCO_GL to egl on Linux only")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MUJOCO_GL", "egl")
        try:
            env = gym.make("HalfCheetah-v5", render_mode="rgb_array", width=32, height=32)
            try:
                env.reset(seed=0)
                frame = env.render()
            finally:
                env.close()
        except Exception as exc:  # any failure to render means "unavailable here"
            pytest.skip(
                f"headless MuJoCo rendering (MUJOCO_GL=egl) is unavailable: "
                f"{type(exc).__name__}: {exc}; on Debian/Ubuntu: apt-get install {EGL_PACKAGES}"
            )
    if frame is None or np.asarray(frame).std() == 0:
        pytest.skip(f"MUJOCO_GL=egl rendered a blank frame; on Debian/Ubuntu: {EGL_PACKAGES}")


class ZeroPolicy:
    """Acts with zero torques (inside every MuJoCo action box)."""

    def __init__(self, action_space: gym.spaces.Box):
        self.space = action_space

    def act(self, obs: np.ndarray, deterministic: bool = True) -> np.ndarray:
        return np.zeros((len(obs), *self.space.shape), self.space.dtype)


@pytest.mark.parametrize(
    "env_id, obs_dim, act_dim", [("HalfCheetah-v5", 17, 6), ("Hopper-v5", 11, 3)]
)
def test_mujoco_env_steps_with_box_actions(env_id, obs_dim, act_dim):
    env = shoal.make_env(env_id, num_envs=2)
    try:
        assert isinstance(env.action_space, gym.spaces.Box)
        assert env.action_space.shape == (act_dim,) and env.observation_space.shape == (obs_dim,)
        obs = env.reset(seed=0)
        assert obs.shape == (2, obs_dim) and np.isfinite(obs).all()
        rng = np.random.default_rng(0)
        space = env.action_space
        for _ in range(5):
            actions = rng.uniform(space.low, space.high, (2, act_dim)).astype(space.dtype)
            result = env.step(actions)
            assert result.obs.shape == (2, obs_dim) and np.isfinite(result.obs).all()
            assert result.reward.shape == (2,) and result.reward.dtype == np.float32
            assert result.terminated.shape == (2,) and result.terminated.dtype == bool
            assert result.truncated.shape == (2,) and result.truncated.dtype == bool
    finally:
        env.close()


def test_max_episode_steps_truncates_mujoco_episodes():
    env = shoal.make_env("HalfCheetah-v5", num_envs=2, max_episode_steps=3)
    try:
        env.reset(seed=0)
        zeros = np.zeros((2, *env.action_space.shape), np.float32)
        results = [env.step(zeros) for _ in range(3)]
        assert results[-1].truncated.all() and not results[-1].terminated.any()
        assert results[-1].episode_lengths.tolist() == [3, 3]
    finally:
        env.close()


@pytest.mark.parametrize("suffix", [".gif", ".mp4"])
def test_record_video_of_mujoco_env_headless(suffix, egl_rendering, tmp_path, monkeypatch):
    # Unset, shoal picks the headless EGL backend itself when it makes a rendering env.
    monkeypatch.delenv("MUJOCO_GL", raising=False)
    config = EnvConfig(id="HalfCheetah-v5", num_envs=1, vectorization="sync", max_episode_steps=10)
    env = make_env(config, render_mode="rgb_array")
    assert os.environ.get("MUJOCO_GL") == "egl"
    video = tmp_path / f"cheetah{suffix}"
    try:
        written = record_video(ZeroPolicy(env.action_space), env, video, seed=0).frames
    finally:
        env.close()
    assert written == 11  # the reset frame and one per step of the 10-step episode
    import imageio.v2 as imageio

    frames = imageio.mimread(video)
    assert len(frames) == written
    assert frames[0].shape[:2] == (480, 480) and np.asarray(frames[0]).std() > 0


def test_cli_eval_writes_mujoco_video(egl_rendering, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("MUJOCO_GL", raising=False)
    run_dir = tmp_path / "run"
    train = ["train", "ppo", "--env", "HalfCheetah-v5", "--env.max-episode-steps", "8",
             "--env.num-envs", "2", "--num-steps", "8", "--minibatch-size", "16",
             "--num-epochs", "1", "--model.hidden", "16", "--total-steps", "16",
             "--run.eval-every-steps", "0", "--run.no-console", "--run.no-tensorboard",
             "--run-dir", str(run_dir)]  # fmt: skip
    assert main(train) == 0
    video = tmp_path / "cheetah.mp4"
    assert main(["eval", str(run_dir), "--episodes", "2", "--video", str(video)]) == 0
    out = capsys.readouterr().out
    assert "2 episodes on HalfCheetah-v5" in out and "(9 frames at 20 frames/s)" in out
    assert video.exists() and video.stat().st_size > 0
