"""Videos of a policy: episodes rendered to an animated GIF or an MP4 at the env's frame rate."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from shoal.core.errors import ShoalError
from shoal.core.interfaces import Policy
from shoal.envs.base import VectorEnv
from shoal.envs.multi_agent import MultiAgentVectorEnv, episode_ended

DEFAULT_FPS = 30.0
"""Frame rate of envs that do not declare a ``render_fps`` in their metadata."""
GIF_MAX_FPS = 50.0
"""GIF delays are whole hundredths of a second, and browsers show delays under 2/100 s as
1/10 s; faster envs are written with every k-th frame, so that the GIF still plays in real
time."""


@dataclass(frozen=True)
class Video:
    """What `record_video` wrote."""

    path: Path
    frames: int
    """Frames in the file."""
    rendered: int
    """Frames rendered (more than ``frames`` when a GIF keeps every k-th frame)."""
    fps: float
    """The env's frame rate (the file plays in real time at it)."""

    def describe(self) -> str:
        text = f"{self.path} ({self.frames} frames at {self.fps:g} frames/s"
        if self.frames < self.rendered:
            step = math.ceil(self.fps / GIF_MAX_FPS)
            text += f"; every {_ordinal(step)} of {self.rendered}: GIFs play at most 50 frames/s"
        return text + ")"


def render_fps(env: Any) -> float:
    """The ``render_fps`` an env (or anything it wraps) declares, else `DEFAULT_FPS`."""
    current, seen = env, set()
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        for candidate in (current, *(getattr(current, "envs", None) or ())[:1]):
            metadata = getattr(candidate, "metadata", None)
            fps = metadata.get("render_fps") if isinstance(metadata, dict) else None
            if fps:
                return float(fps)
        current = getattr(current, "env", None)
    return DEFAULT_FPS


def record_video(policy: Policy, env: VectorEnv, path: Path, seed: int, episodes: int = 1) -> Video:
    """Render ``episodes`` episodes of the first env (deterministic actions) to ``path``, a
    .gif or an .mp4 that plays at the env's `render_fps`, and loops (GIF). ``env`` may also
    be a multi-agent vector env acted on by a `shoal.nn.policy.JointPolicy`."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".gif", ".mp4"):
        raise ShoalError(f"video path {path} must end in .gif or .mp4")
    joint = isinstance(env, MultiAgentVectorEnv)
    obs, state = env.reset(seed=seed) if joint else (env.reset(seed=seed), None)
    extras = {"state": state} if joint else {}  # the global state a joint policy may read
    frames: list[Any] = [env.render()]
    if frames[0] is None:
        raise ShoalError("this environment cannot render rgb_array frames")
    finished = 0
    while finished < episodes:
        mask = getattr(env, "action_mask", None)  # legal actions, where the env has them
        if mask is not None:
            extras["action_mask"] = mask
        result: Any = env.step(policy.act(obs, deterministic=True, **extras))
        obs = result.obs
        if joint:
            extras["state"] = result.state
        if result.autoreset[0]:
            continue  # the autoreset step shows the first frame of the next episode
        frames.append(env.render())
        if joint:
            finished += int(episode_ended(result)[0])
        else:
            finished += int(result.terminated[0] or result.truncated[0])
    fps = render_fps(env)
    path.parent.mkdir(parents=True, exist_ok=True)
    write = write_gif if suffix == ".gif" else write_mp4
    return Video(path, write(path, frames, fps), len(frames), fps)


def write_gif(path: Path, frames: list[np.ndarray], fps: float) -> int:
    """An animated GIF that loops forever and keeps every frame (identical consecutive frames
    included, which Pillow's own writer merges) at ``fps``, or every k-th frame above
    `GIF_MAX_FPS`. Returns the frames written.

    All frames share one 256-colour palette taken from up to 16 frames spread over the video,
    so each frame costs one palette lookup and one LZW encoding (both in Pillow's C code): the
    time is proportional to the frames. Delays are whole hundredths of a second; they are
    rounded cumulatively, so a 30 frames/s video alternates 3 and 4 and keeps real time."""
    from PIL import GifImagePlugin, Image

    step = max(1, math.ceil(fps / GIF_MAX_FPS))
    frames = frames[::step]
    rate = fps / step
    sample = frames[:: max(1, len(frames) // 16)][:16]
    palette = Image.fromarray(np.concatenate([_rgb(f) for f in sample], axis=0)).quantize(
        colors=256, method=Image.Quantize.FASTOCTREE, dither=Image.Dither.NONE
    )
    images = [
        Image.fromarray(_rgb(f)).quantize(palette=palette, dither=Image.Dither.NONE) for f in frames
    ]
    header, _ = GifImagePlugin.getheader(images[0], info={"loop": 0})
    try:
        with open(path, "wb") as out:
            out.writelines(header)
            for i, image in enumerate(images):
                centis = round((i + 1) * 100 / rate) - round(i * 100 / rate)
                # Pillow writes duration // 10 hundredths; pass whole hundredths in ms.
                out.writelines(GifImagePlugin.getdata(image, duration=10 * max(centis, 2)))
            out.write(b";")  # trailer
    except OSError as exc:
        raise ShoalError(f"could not write {path}: {exc.strerror or exc}") from exc
    return len(images)


def write_mp4(path: Path, frames: list[np.ndarray], fps: float) -> int:
    """An H.264 MP4 at ``fps`` (needs imageio-ffmpeg, the ``video`` extra)."""
    import imageio.v2 as imageio

    try:
        # H.264 with yuv420p needs even frame sizes; anything stricter would rescale frames.
        imageio.mimsave(path, list(frames), fps=fps, macro_block_size=2)
    except (ImportError, ValueError, RuntimeError, OSError) as exc:
        raise ShoalError(
            f"could not write {path}: {exc}. For .mp4 install the video extra "
            "(pip install 'shoal[video]') or write a .gif"
        ) from exc
    return len(frames)


def _rgb(frame: np.ndarray) -> np.ndarray:
    """An ``[H, W, 3]`` uint8 frame (grayscale frames get three equal channels)."""
    frame = np.asarray(frame)
    if frame.ndim == 2:
        frame = np.repeat(frame[..., None], 3, axis=-1)
    return np.ascontiguousarray(frame[..., :3], dtype=np.uint8)


def _ordinal(n: int) -> str:
    return {1: "1st", 2: "2nd", 3: "3rd"}.get(n, f"{n}th")
