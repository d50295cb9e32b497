"""Atari preprocessing: DeepMind's standard pipeline and the variant of Lamb et al., "Deep
Reinforcement Learning with Actor-Critic" (UC San Diego, undated).

``EnvConfig.atari`` picks the pipeline for an ALE id (``ALE/Pong-v5``, ``PongNoFrameskip-v4``, ...;
the ids ale-py registers in Gymnasium):

deepmind
    No-op reset (1 to 30 NOOPs), FIRE after every reset in games that need it, frame skip 4 with
    the max over the last two frames, 84x84 grayscale, the last 4 frames stacked: uint8
    observations ``[4, 84, 84]``. For training (``EnvConfig.atari_training``) an episode also
    ends at every life loss (the game goes on: the next step presses FIRE, or NOOP, instead of
    resetting) and rewards are clipped to their sign. Logged episode returns are always the true
    score of a whole game (`AtariEpisodes`). The env id keeps its own sticky actions (0.25 for
    ``ALE/*-v5``, none for ``*NoFrameskip-v4``); its own frame skip is replaced by the pipeline's.

    Two implementations with the same semantics: ale-py's C++ vector env
    (``ale_py.vector_env.AtariVectorEnv``, ``vectorization`` ``native``) and Gymnasium's
    ``AtariPreprocessing`` + ``FrameStackObservation`` per env (``sync`` / ``async``). ``auto``
    takes the native one: for 8 Pong envs on 2 shared CPUs it ran about 14,500 frames/s
    (3,600 agent steps/s), ``sync`` about 11,000 and ``async`` 6,600. The two resize frames
    differently, so their observations are close, not equal.

crop80-stack / crop80-diff
    Lamb et al. (actor-critic on Pong and Breakout): the 210x160 RGB frame is
    cropped to 160x160, converted to grayscale and downsampled to 80x80; the CNN models see the
    last 4 such frames stacked (uint8 ``[4, 80, 80]``), the linear model the difference of the
    current and the previous frame (float32 ``[1, 80, 80]`` in [-1, 1], zero after a reset). The
    env id's own frame skip and sticky actions apply, nothing else (no episodic life, no
    clipping: Pong's rewards are already -1/+1). Evaluation envs start each game with 1 to 30
    NOOPs (`NoopStart`), so that their games differ where the id is deterministic; training
    envs do not. Gymnasium wrappers only (``sync`` / ``async``).
    ``*NoFrameskip-v4`` ids act on every frame unless ``EnvConfig.kwargs`` sets ``frameskip``
    (the tuned examples set 4), and shoal warns when they would.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import gymnasium as gym
import numpy as np

from shoal.config import EnvConfig
from shoal.core.errors import ConfigError
from shoal.envs.ids import env_spec
from shoal.envs.shapes import shape_of

__all__ = [
    "AtariEpisodes",
    "FireReset",
    "FrameDifference",
    "Crop80Frame",
    "NoopStart",
    "make_atari_env",
    "make_atari_vector_env",
    "crop80_frame",
]

FRAME_SKIP = 4
EVAL_MAX_STEPS = 27_000
"""The evaluation time limit of Atari games: 108,000 frames (30 minutes of play), the limit
of Machado et al., "Revisiting the Arcade Learning Environment: Evaluation Protocols and Open
Problems for General Agents" (2018)."""
NOOP_MAX = 30
SCREEN_SIZE = 84
STACK = 4
CROP80_TOP = 34
"""First row of Lamb et al.'s 160x160 crop: rows 34-193 hold Pong's playing field (the score
above and the bottom border are cut), as in Kostrikov's pytorch-a3c, the reference's baseline."""

# Keyword arguments of the ALE env constructors that the native vector env accepts as well.
_NATIVE_KWARGS = ("repeat_action_probability", "full_action_space", "max_num_frames_per_episode")


def require_ale() -> None:
    """Import ale-py and register its ids in Gymnasium, or say which extra to install."""
    try:
        import ale_py
    except ImportError as exc:
        raise ConfigError(
            "Atari environments need ale-py and opencv: pip install 'shoal[atari]'"
        ) from exc
    gym.register_envs(ale_py)


def _fire_action(action_meanings: list[str]) -> int | None:
    return action_meanings.index("FIRE") if "FIRE" in action_meanings else None


class FireReset(gym.Wrapper):
    """Press FIRE once after every reset, for games that wait for it to start (Breakout)."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.fire = _fire_action(_game_action_meanings(env))

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        if self.fire is None:
            return obs, info
        obs, _, terminated, truncated, step_info = self.env.step(self.fire)
        if terminated or truncated:
            return self.env.reset(options=options)
        return obs, {**info, **step_info}


class NoopStart(gym.Wrapper):
    """After every reset, 1 to ``noop_max`` NOOP steps (drawn from the env's seeded generator)
    before the first observation: the start-state randomization of Mnih et al., "Human-level
    control through deep reinforcement learning" (2015). Without it, a greedy policy in a
    deterministic ALE game (``*NoFrameskip-v4`` with a fixed frame skip) plays the same game in
    every evaluation env. A game that ends during the NOOPs is reset again."""

    def __init__(self, env: gym.Env, noop_max: int = NOOP_MAX):
        super().__init__(env)
        if noop_max < 1:
            raise ConfigError(f"noop_max must be >= 1, got {noop_max}")
        self.noop_max = noop_max

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        for _ in range(int(self.np_random.integers(1, self.noop_max + 1))):
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                obs, info = self.env.reset(options=options)
        return obs, info


def crop80_frame(frame: np.ndarray, crop_top: int = CROP80_TOP) -> np.ndarray:
    """Lamb et al.'s frame: crop a 210x160x3 RGB frame to rows ``crop_top`` to
    ``crop_top + 159``, grayscale (ITU-R 601 luma, as OpenCV), 2x2 mean to 80x80, uint8."""
    crop = frame[crop_top : crop_top + 160, :160].astype(np.float32)
    gray = crop @ np.array([0.299, 0.587, 0.114], np.float32)
    small = gray.reshape(80, 2, 80, 2).mean(axis=(1, 3))
    return np.clip(np.rint(small), 0, 255).astype(np.uint8)


class Crop80Frame(gym.ObservationWrapper):
    """RGB Atari frames to Lamb et al.'s 80x80 grayscale frames (`crop80_frame`)."""

    def __init__(self, env: gym.Env, crop_top: int = CROP80_TOP):
        super().__init__(env)
        shape = env.observation_space.shape
        if shape is None or tuple(shape) != (210, 160, 3):
            raise ConfigError(f"Lamb et al.'s preprocessing needs 210x160x3 frames, got {shape}")
        self.crop_top = crop_top
        self.observation_space = gym.spaces.Box(0, 255, (80, 80), np.uint8)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return crop80_frame(observation, self.crop_top)


class FrameDifference(gym.Wrapper):
    """The difference of the current and the previous frame, scaled to [-1, 1], as one channel;
    zero right after a reset (there is no previous frame)."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        shape = shape_of(env.observation_space)
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (1, *shape))
        self.previous = np.zeros(shape, np.uint8)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        self.previous = np.array(obs, np.uint8)
        return self._difference(obs), info

    def step(self, action: Any):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return self._difference(obs), reward, terminated, truncated, info

    def _difference(self, obs: np.ndarray) -> np.ndarray:
        diff = (obs.astype(np.float32) - self.previous.astype(np.float32)) / 255.0
        self.previous = np.array(obs, np.uint8)
        return diff[None]


def make_atari_env(
    env_id: str,
    mode: str = "deepmind",
    max_episode_steps: int | None = None,
    render_mode: str | None = None,
    noop_start: bool = False,
    **kwargs: Any,
) -> gym.Env:
    """One preprocessed Atari env for ``mode`` (see the module docstring); ``kwargs`` go to the
    ALE constructor. Life loss and reward clipping are not here but in `AtariEpisodes`.
    ``noop_start`` adds `NoopStart` to the crop80 modes (deepmind has its no-op reset always)."""
    require_ale()
    if mode == "deepmind":
        # Grayscale straight from the emulator: AtariPreprocessing reads the screen itself.
        env = gym.make(env_id, frameskip=1, obs_type="grayscale", render_mode=render_mode, **kwargs)
        env = AtariPreprocessing(env)
        env = FireReset(env)
    elif mode in ("crop80-stack", "crop80-diff"):
        env = Crop80Frame(gym.make(env_id, obs_type="rgb", render_mode=render_mode, **kwargs))
        if getattr(env.unwrapped, "_frameskip", None) == 1:
            warnings.warn(
                f"{env_id} with {mode} acts on every frame (this preprocessing keeps the id's "
                "own frame skip, and this id has none): budgets in agent steps are then frames, "
                "and a game lasts 4x the steps it does with the usual skip of 4; set "
                "env.kwargs.frameskip 4 (or use an id that skips frames) unless that is meant",
                stacklevel=2,
            )
        if noop_start:
            env = NoopStart(env)
    else:
        raise ConfigError(f"unknown Atari preprocessing {mode!r}")
    if max_episode_steps is not None:
        env = gym.wrappers.TimeLimit(env, max_episode_steps)
    if mode == "crop80-diff":
        return FrameDifference(env)
    return gym.wrappers.FrameStackObservation(env, STACK)


def AtariPreprocessing(env: gym.Env) -> gym.Env:  # noqa: N802 (a wrapper "class")
    """Gymnasium's wrapper with DeepMind's settings (no life loss: `AtariEpisodes` does it)."""
    return gym.wrappers.AtariPreprocessing(
        env, noop_max=NOOP_MAX, frame_skip=FRAME_SKIP, screen_size=SCREEN_SIZE
    )


class AtariEpisodes(gym.vector.VectorWrapper):
    """Episodic life and reward clipping for training, and the true game scores for logging.

    The wrapped vector env plays whole games (terminated at game over) with true rewards and
    reports ``info["lives"]``. With ``training``, a life loss ends the episode (``terminated``)
    and rewards are clipped to their sign; the game itself goes on: in the next step, which
    the learner sees as the autoreset step (Gymnasium's next-step convention), the env presses
    FIRE (or NOOP) in place of the learner's action and the reward counts zero. Without
    ``training`` the step after a life loss presses FIRE (or NOOP) as well, so that evaluating a
    greedy policy cannot stall with the ball unlaunched. Either way
    ``info["episode"]`` (``"r"`` return, ``"l"`` length in agent steps) and ``info["_episode"]``
    (which envs finished a game) carry the statistics of whole games with true rewards, in
    Gymnasium's ``RecordEpisodeStatistics`` layout; `shoal.envs.gym.GymVectorEnv` logs them
    instead of its reward sums.
    """

    def __init__(self, env: gym.vector.VectorEnv, training: bool, reset_action: int | None):
        super().__init__(env)
        mode = env.metadata.get("autoreset_mode", gym.vector.AutoresetMode.NEXT_STEP)
        if mode != gym.vector.AutoresetMode.NEXT_STEP:
            raise ConfigError(f"AtariEpisodes expects next-step autoreset, the env uses {mode}")
        self.training = training
        self.reset_action = 0 if reset_action is None else reset_action
        n = env.num_envs
        self.lives = np.zeros(n, np.int64)
        self.life_reset = np.zeros(n, bool)
        """The env lost a life in the last step: this step replaces the reset."""
        self.game_reset = np.zeros(n, bool)
        """The wrapped env autoresets in this step (its game ended in the last one)."""
        self.game_return = np.zeros(n, np.float64)
        self.game_length = np.zeros(n, np.int64)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        self.lives = np.asarray(info["lives"], np.int64).copy()
        self.life_reset[:] = False
        self.game_reset[:] = False
        self.game_return[:] = 0.0
        self.game_length[:] = 0
        return obs, info

    def step(self, actions: np.ndarray):
        actions = np.array(actions, copy=True)
        life_reset = self.life_reset
        actions[life_reset] = self.reset_action
        obs, reward, terminated, truncated, info = self.env.step(actions)
        reward = np.asarray(reward, np.float64)
        lives = np.asarray(info["lives"], np.int64)
        game_reset = self.game_reset
        self.game_return = np.where(game_reset, 0.0, self.game_return + reward)
        self.game_length = np.where(game_reset, 0, self.game_length + 1)
        game_over = np.logical_or(terminated, truncated)
        info = dict(info)
        info["episode"] = {"r": self.game_return.copy(), "l": self.game_length.copy()}
        info["_episode"] = game_over.copy()
        # Qbert shows 0 lives one step before game over, hence lives > 0 (as baselines).
        lost = (lives < self.lives) & (lives > 0) & ~game_over & ~game_reset & ~life_reset
        if self.training:
            reward = np.sign(reward)
            terminated = np.logical_or(terminated, lost)
            reward = np.where(life_reset, 0.0, reward)  # the learner's autoreset step
        # In evaluation too the step after a life loss presses FIRE (or NOOP): otherwise a
        # greedy policy that never picks FIRE waits for the time limit with the ball unlaunched
        # in games like Breakout. True scores are unaffected (they come from info["episode"]).
        self.lives = lives.copy()
        self.life_reset = lost
        self.game_reset = game_over
        return obs, reward, terminated, truncated, info


def make_atari_vector_env(
    config: EnvConfig, training: bool = True, render_mode: str | None = None
) -> gym.vector.VectorEnv:
    """The vector env for ``config.atari`` (not "none"); ``training`` enables episodic life and
    reward clipping of the deepmind pipeline. Evaluation envs (``training`` off) without a
    ``max_episode_steps`` of their own end a game at `EVAL_MAX_STEPS`, so that a policy that
    never finishes one cannot hold an evaluation for the env's own limit (400,000 frames)."""
    require_ale()
    if not training and config.max_episode_steps is None:
        config = dataclasses.replace(config, max_episode_steps=EVAL_MAX_STEPS)
    spec = env_spec(config.id)
    if not str(spec.entry_point).startswith("ale_py"):
        raise ConfigError(f"EnvConfig.atari = {config.atari!r} needs an ALE id, not {config.id}")
    mode = config.vectorization
    if mode == "auto":
        native_ok = config.atari == "deepmind" and render_mode is None
        mode = "native" if native_ok else "sync"
    if mode == "native":
        if config.atari != "deepmind":
            raise ConfigError(
                f"EnvConfig.vectorization = 'native' is invalid with atari = {config.atari!r}: "
                "ale-py's vector env implements only the deepmind pipeline; use 'sync' or 'async'"
            )
        if render_mode is not None:
            raise ConfigError("ale-py's vector env cannot render; use vectorization 'sync'")
        env = _native_vector_env(spec, config)
        fire = _fire_action(_action_meanings(env))
    else:
        kwargs: dict[str, Any] = dict(config.kwargs)

        def thunk() -> gym.Env:
            return make_atari_env(
                config.id,
                config.atari,
                config.max_episode_steps,
                render_mode,
                noop_start=not training,
                **kwargs,
            )

        vector_cls = gym.vector.SyncVectorEnv if mode == "sync" else gym.vector.AsyncVectorEnv
        env = vector_cls([thunk] * config.num_envs)
        probe = gym.make(config.id, **kwargs)
        fire = _fire_action(_game_action_meanings(probe))
        probe.close()
    if config.atari != "deepmind":
        return env
    return AtariEpisodes(env, training=training, reset_action=fire)


def _native_vector_env(spec: gym.envs.registration.EnvSpec, config: EnvConfig):
    from ale_py.vector_env import AtariVectorEnv

    kwargs = {k: v for k, v in spec.kwargs.items() if k in _NATIVE_KWARGS}
    for key, value in config.kwargs.items():
        if key not in _NATIVE_KWARGS:
            raise ConfigError(
                f"EnvConfig.kwargs[{key!r}] is not supported by ale-py's vector env (it takes "
                f"{', '.join(_NATIVE_KWARGS)}); use vectorization 'sync'"
            )
        kwargs[key] = value
    if config.max_episode_steps is not None:
        kwargs["max_num_frames_per_episode"] = config.max_episode_steps * FRAME_SKIP
    return AtariVectorEnv(
        game=spec.kwargs["game"],
        num_envs=config.num_envs,
        frameskip=FRAME_SKIP,
        stack_num=STACK,
        img_height=SCREEN_SIZE,
        img_width=SCREEN_SIZE,
        grayscale=True,
        maxpool=True,
        noop_max=NOOP_MAX,
        use_fire_reset=True,
        episodic_life=False,
        reward_clipping=False,
        **kwargs,
    )


def _game_action_meanings(env: gym.Env) -> list[str]:
    """The action names of the ALE game inside ``env``."""
    game: Any = env.unwrapped
    return list(game.get_action_meanings())


def _action_meanings(env: Any) -> list[str]:
    return [action.name for action in env.ale.get_action_set()]
