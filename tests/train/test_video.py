"""GIFs and MP4s of a policy: every frame kept, real-time delays, looping, fast encoding."""

import time

import numpy as np
import pytest
from PIL import Image

from shoal.config import EnvConfig
from shoal.core.errors import ShoalError
from shoal.envs.make import make_env
from shoal.train.video import DEFAULT_FPS, record_video, render_fps, write_gif


class LeftPolicy:
    def act(self, obs, deterministic=True):
        return np.zeros(len(obs), dtype=np.int64)


def cartpole():
    return make_env(EnvConfig(id="CartPole-v1", num_envs=1), render_mode="rgb_array")


def frames_of(n, size=(40, 60), identical=False):
    rng = np.random.default_rng(0)
    first = rng.integers(0, 255, (*size, 3), dtype=np.uint8)
    return [
        first if identical else rng.integers(0, 255, (*size, 3), dtype=np.uint8) for _ in range(n)
    ]


def gif_info(path):
    with Image.open(path) as gif:
        durations = []
        for i in range(gif.n_frames):
            gif.seek(i)
            durations.append(gif.info["duration"])
        return gif.n_frames, durations, gif.info.get("loop")


def test_gif_keeps_identical_frames_loops_and_plays_at_the_frame_rate(tmp_path):
    path = tmp_path / "still.gif"
    assert write_gif(path, frames_of(25, identical=True), fps=50) == 25
    n, durations, loop = gif_info(path)
    assert n == 25  # Pillow's own writer would merge these into one frame
    assert durations == [20] * 25 and loop == 0  # 1/50 s each, loops forever


def test_gif_delays_keep_real_time_at_30_fps(tmp_path):
    """Delays are whole hundredths: 30 frames/s alternates 30 and 40 ms, 1 s per 30 frames."""
    path = tmp_path / "thirty.gif"
    assert write_gif(path, frames_of(30), fps=30) == 30
    n, durations, _ = gif_info(path)
    assert n == 30 and sum(durations) == 1000 and set(durations) == {30, 40}


def test_gif_above_50_fps_keeps_every_kth_frame_in_real_time(tmp_path):
    path = tmp_path / "fast.gif"
    assert write_gif(path, frames_of(120), fps=120) == 40  # every 3rd frame: 40 frames/s
    n, durations, _ = gif_info(path)
    assert n == 40 and sum(durations) == 1000


def test_gif_encoding_time_grows_with_the_frames(tmp_path):
    def encode(n):
        start = time.perf_counter()
        write_gif(tmp_path / f"{n}.gif", frames_of(n, size=(200, 300)), fps=50)
        return time.perf_counter() - start

    encode(10)  # imports
    small, large = min(encode(50) for _ in range(2)), min(encode(400) for _ in range(2))
    assert large < 8 * small * 2.5, (small, large)  # 8x the frames: about 8x the time
    assert large < 10.0


def test_cartpole_gif_plays_at_its_render_fps(tmp_path):
    env = cartpole()
    try:
        assert render_fps(env) == 50
        video = record_video(LeftPolicy(), env, tmp_path / "c.gif", seed=0)
    finally:
        env.close()
    n, durations, loop = gif_info(video.path)
    assert n == video.frames == video.rendered and n > 5
    assert set(durations) == {20} and loop == 0
    assert "frames at 50 frames/s" in video.describe()


def test_render_fps_defaults_when_undeclared():
    class Bare:
        metadata = {}

    assert render_fps(Bare()) == DEFAULT_FPS


def test_video_needs_a_known_suffix(tmp_path):
    env = cartpole()
    try:
        with pytest.raises(ShoalError, match=r"\.gif or \.mp4"):
            record_video(LeftPolicy(), env, tmp_path / "c.avi", seed=0)
    finally:
        env.close()
