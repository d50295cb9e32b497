"""Atari preprocessing (`shoal.envs.atari`): DeepMind's pipeline and Lamb et al.'s variant."""

from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("ale_py", reason="needs the atari extra: pip install 'shoal[atari]'")
cv2 = pytest.importorskip("cv2", reason="needs the atari extra: pip install 'shoal[atari]'")

from shoal.config import EnvConfig, RunConfig  # noqa: E402
from shoal.core.errors import ConfigError  # noqa: E402
from shoal.envs import GymVectorEnv, make_env  # noqa: E402
from shoal.envs.atari import (  # noqa: E402
    AtariEpisodes,
    Crop80Frame,
    FrameDifference,
    NoopStart,
    crop80_frame,
    make_atari_env,
    make_atari_vector_env,
)
from shoal.train.session import make_eval_env  # noqa: E402


def _config(env_id="ALE/Pong-v5", **kwargs):
    return EnvConfig(id=env_id, **{"num_envs": 2, "atari": "deepmind", **kwargs})


@pytest.mark.parametrize(
    ("atari", "vectorization", "shape", "dtype"),
    [
        ("deepmind", "native", (4, 84, 84), np.uint8),
        ("deepmind", "sync", (4, 84, 84), np.uint8),
        ("crop80-stack", "auto", (4, 80, 80), np.uint8),
        ("crop80-diff", "auto", (1, 80, 80), np.float32),
    ],
)
def test_shapes_and_dtypes(atari, vectorization, shape, dtype):
    env = make_env(_config(atari=atari, vectorization=vectorization))
    try:
        assert env.observation_space.shape == shape
        assert env.observation_space.dtype == dtype
        obs = env.reset(seed=0)
        assert obs.shape == (2, *shape) and obs.dtype == dtype
        step = env.step(np.zeros(2, np.int64))
        assert step.obs.shape == (2, *shape) and step.obs.dtype == dtype
    finally:
        env.close()


def test_crop80_without_a_frame_skip_warns_and_the_kwarg_sets_one(recwarn):
    """Lamb et al.'s preprocessing keeps the id's frame skip: a NoFrameskip id acts on every
    frame, which shoal says, and ``frameskip`` in the env's kwargs makes it skip 4 (a Pong
    game then lasts about 800 agent steps, not about 3,300)."""
    with pytest.warns(UserWarning, match="acts on every frame"):
        make_atari_env("PongNoFrameskip-v4", "crop80-stack").close()
    env = make_atari_env("PongNoFrameskip-v4", "crop80-stack", frameskip=4)
    assert env.unwrapped._frameskip == 4 and not [w for w in recwarn if "every frame" in str(w)]
    env.close()
    config = _config("PongNoFrameskip-v4", atari="crop80-stack", kwargs={"frameskip": 4})
    vector = make_env(config)
    assert not [w for w in recwarn if "every frame" in str(w)]
    vector.close()


def test_native_vectorization_refuses_reference_001():
    with pytest.raises(ConfigError, match="native"):
        make_env(_config(atari="crop80-stack", vectorization="native"))


def test_frame_skip_max_pools_the_last_two_raw_frames():
    env = make_atari_env("PongNoFrameskip-v4")  # no sticky actions: replays are exact
    env.reset(seed=0)
    raw, ale = env.unwrapped, env.unwrapped.ale
    differs_from_last_frame = False
    for action in [2, 2, 3, 0, 3, 2, 2, 2, 3, 3, 0, 2]:
        state = ale.cloneState()
        frames = []
        for _ in range(4):
            raw.step(action)
            frames.append(ale.getScreenGrayscale())
        pooled = np.maximum(frames[2], frames[3])
        expected = cv2.resize(pooled, (84, 84), interpolation=cv2.INTER_AREA)
        last_only = cv2.resize(frames[3], (84, 84), interpolation=cv2.INTER_AREA)
        differs_from_last_frame |= not np.array_equal(expected, last_only)
        ale.restoreState(state)
        obs, *_ = env.step(action)
        np.testing.assert_array_equal(obs[-1], expected)
    assert differs_from_last_frame  # the ball moved: pooling mattered in some step
    env.close()


def test_frame_stack_shifts_and_restarts_at_reset():
    env = make_atari_env("PongNoFrameskip-v4")
    obs, _ = env.reset(seed=0)
    assert all(np.array_equal(obs[i], obs[-1]) for i in range(4))  # padded with the first frame
    for _ in range(40):
        new, *_ = env.step(2)
        np.testing.assert_array_equal(new[:-1], obs[1:])
        obs = new
    assert not np.array_equal(obs[0], obs[-1])
    obs, _ = env.reset(seed=1)
    assert all(np.array_equal(obs[i], obs[-1]) for i in range(4))  # nothing of the old game
    env.close()

    native = make_env(_config(vectorization="native"))
    obs = native.reset(seed=0)
    for _ in range(5):
        new = native.step(np.full(2, 2)).obs
        np.testing.assert_array_equal(new[:, :-1], obs[:, 1:])
        obs = new
    native.close()


def test_noop_starts_differ_between_seeds():
    env = make_atari_env("PongNoFrameskip-v4")
    frames = set()
    for seed in range(8):
        _, info = env.reset(seed=seed)
        frames.add(int(info["episode_frame_number"]))
    env.close()
    # 1 to 30 NOOP frames, then FIRE (Pong has it) for one skipped step of 4 frames.
    assert len(frames) >= 4 and min(frames) >= 5 and max(frames) <= 34

    native = make_atari_vector_env(_config(vectorization="native", num_envs=8))
    _, info = native.reset(seed=0)
    assert len(set(info["episode_frame_number"].tolist())) >= 3
    native.close()


class CountingGame(gym.Env):
    """A game of ``length`` steps that records its resets and actions."""

    observation_space = gym.spaces.Box(0, 255, (1,), np.uint8)
    action_space = gym.spaces.Discrete(3)

    def __init__(self, length):
        self.length, self.resets, self.actions = length, 0, []

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.resets, self.t = self.resets + 1, 0
        return np.array([0], np.uint8), {}

    def step(self, action):
        self.actions.append(int(action))
        self.t += 1
        return np.array([self.t], np.uint8), 0.0, self.t == self.length, False, {}


def test_noop_start_presses_noop_a_seeded_number_of_times():
    counts = {}
    for seed in range(50):
        game = CountingGame(length=100)
        obs, _ = NoopStart(game, noop_max=5).reset(seed=seed)
        assert set(game.actions) == {0} and int(obs[0]) == len(game.actions)  # NOOPs only
        counts[seed] = len(game.actions)
        again = CountingGame(length=100)
        NoopStart(again, noop_max=5).reset(seed=seed)
        assert len(again.actions) == counts[seed]  # the seed decides
    assert set(counts.values()) == {1, 2, 3, 4, 5}
    game = CountingGame(length=1)  # every game ends at its first step: reset again
    NoopStart(game, noop_max=1).reset(seed=0)
    assert game.resets == 2
    with pytest.raises(ConfigError, match="noop_max"):
        NoopStart(CountingGame(1), noop_max=0)


@pytest.mark.parametrize("atari", ["crop80-stack", "crop80-diff"])
def test_crop80_evaluation_games_start_apart_and_training_games_do_not(atari):
    """A greedy policy on a deterministic id would play one game in every evaluation env:
    evaluation envs start with NOOPs, training envs (Lamb et al.'s pipeline) do not."""
    config = SimpleNamespace(
        run=RunConfig(eval_episodes=8),
        env=_config("PongNoFrameskip-v4", atari=atari, kwargs={"frameskip": 4}, num_envs=8),
    )
    for env, apart in ((make_eval_env(config), True), (make_env(config.env), False)):
        env.reset(seed=0)
        frames = [game.unwrapped.ale.getEpisodeFrameNumber() for game in env.env.envs]
        env.close()
        assert (len(set(frames)) >= 4) == apart, frames
        assert max(frames) <= 4 * 30


class ScriptedAtari(gym.vector.VectorEnv):
    """One env replaying (reward, lives, terminated) rows, recording the actions it gets."""

    def __init__(self, script):
        self.script = list(script)
        self.num_envs = 1
        self.single_action_space = gym.spaces.Discrete(4)
        self.single_observation_space = gym.spaces.Box(0, 255, (1,), np.uint8)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, 1)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, 1)
        self.metadata = {"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP}
        self.actions = []

    def reset(self, *, seed=None, options=None):
        return np.zeros((1, 1), np.uint8), {"lives": np.array([3])}

    def step(self, actions):
        self.actions.append(int(actions[0]))
        reward, lives, terminated = self.script.pop(0)
        obs = np.zeros((1, 1), np.uint8)
        return (
            obs,
            np.array([reward]),
            np.array([terminated]),
            np.array([False]),
            {"lives": np.array([lives])},
        )


# reward, lives, terminated: a game of 3 lives with rewards 4, 1 and -2, 7 in the steps that
# follow life losses (the env's pseudo-reset steps), then the next game.
SCRIPT = [(4, 3, False), (0, 2, False), (1, 2, False), (-2, 1, False), (7, 1, False)]
SCRIPT += [(0, 1, False), (1, 0, True), (0, 3, False), (5, 3, False)]


@pytest.mark.parametrize("training", [True, False])
def test_life_loss_and_clipping_only_in_training_with_true_game_scores(training):
    inner = ScriptedAtari(SCRIPT)
    env = GymVectorEnv(AtariEpisodes(inner, training, reset_action=1), episode_info=True)
    env.reset(seed=0)
    steps = [env.step(np.array([3])) for _ in SCRIPT]
    terminated = [bool(s.terminated[0]) for s in steps]
    rewards = [float(s.reward[0]) for s in steps]
    if training:
        # Life lost after steps 1 and 3: those end an episode; the next step is the learner's
        # autoreset step, in which the env presses FIRE and the reward does not count.
        assert terminated == [False, True, False, True, False, False, True, False, False]
        assert steps[2].autoreset[0] and steps[4].autoreset[0]
        assert inner.actions == [3, 3, 1, 3, 1, 3, 3, 3, 3]
        assert rewards == [1, 0, 0, -1, 0, 0, 1, 0, 1]
    else:
        assert terminated == [False, False, False, False, False, False, True, False, False]
        # No episode ends at a life loss, but the next step still presses FIRE so that a greedy
        # policy cannot stall with the ball unlaunched; its reward is real and counts.
        assert inner.actions == [3, 3, 1, 3, 1, 3, 3, 3, 3]
        assert rewards == [4, 0, 1, -2, 7, 0, 1, 0, 5]
    # Logged once per game, with true rewards, counting every agent step of the game.
    logged = [(list(s.episode_returns), list(s.episode_lengths)) for s in steps]
    assert logged[6] == ([11.0], [7])
    assert all(not r for i, (r, _) in enumerate(logged) if i != 6)


def test_breakout_training_episodes_are_lives_but_logged_episodes_are_games():
    env = make_atari_vector_env(_config("ALE/Breakout-v5", vectorization="native"))
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    lives_per_game, episodes, clipped = [], np.zeros(2, int), np.zeros(2)
    while len(lives_per_game) < 3:
        _, reward, terminated, truncated, info = env.step(rng.integers(0, 4, 2))
        episodes += terminated
        clipped += reward
        assert set(np.unique(reward)) <= {0.0, 1.0}
        for i in np.flatnonzero(info["_episode"]):
            lives_per_game.append(int(episodes[i]))
            assert info["episode"]["r"][i] >= clipped[i] >= 0  # true score >= clipped sum
            episodes[i], clipped[i] = 0, 0.0
    env.close()
    assert lives_per_game[:3] == [5, 5, 5]  # 5 training episodes (lives) per logged game


def test_evaluation_env_has_no_training_preprocessing():
    config = SimpleNamespace(
        run=RunConfig(eval_episodes=2), env=_config(vectorization="native", num_envs=4)
    )
    env = make_eval_env(config)
    try:
        episodes = env.env
        assert isinstance(episodes, AtariEpisodes) and not episodes.training
    finally:
        env.close()
    train_env = make_env(config.env)
    assert train_env.env.training
    train_env.close()


@pytest.mark.parametrize("vectorization", ["native", "sync"])
def test_evaluation_games_end_at_the_protocol_time_limit(vectorization, monkeypatch):
    """An evaluation game ends at EVAL_MAX_STEPS (here 30) where the config sets no limit of
    its own: a policy that never finishes a game cannot hold an evaluation; training is not
    cut there."""
    import shoal.envs.atari as atari

    monkeypatch.setattr(atari, "EVAL_MAX_STEPS", 30)
    config = SimpleNamespace(
        run=RunConfig(eval_episodes=1), env=_config(vectorization=vectorization, num_envs=1)
    )
    for env, limited in ((make_eval_env(config), True), (make_env(config.env), False)):
        env.reset(seed=0)
        ended = []
        for step in range(1, 41):
            result = env.step(np.zeros(1, np.int64))
            if result.truncated[0] or result.terminated[0]:
                ended.append(step)
        env.close()
        assert (ended[:1] == [30]) == limited, ended


def _hand_made_frames():
    frame = np.zeros((210, 160, 3), np.uint8)
    frame[:34] = 200  # score area: cropped away
    frame[194:] = 100  # bottom border: cropped away
    frame[34 + 10 : 34 + 12, 20:22] = 255  # white 2x2 block -> (5, 10) = 255
    frame[34:36, 0:2] = (255, 0, 0)  # red 2x2 block -> (0, 0) = 0.299 * 255 = 76.2
    frame[34 + 20, 40] = 255  # one white pixel -> (10, 20) = 255 / 4 = 63.75
    moved = frame.copy()
    moved[34 + 10 : 34 + 12, 20:22] = 0
    moved[34 + 10 : 34 + 12, 22:24] = 255  # the block moved one pixel of 80 right
    expected = np.zeros((80, 80), np.uint8)
    expected[5, 10], expected[0, 0], expected[10, 20] = 255, 76, 64
    expected_moved = expected.copy()
    expected_moved[5, 10], expected_moved[5, 11] = 0, 255
    return frame, moved, expected, expected_moved


class FrameReplay(gym.Env):
    observation_space = gym.spaces.Box(0, 255, (210, 160, 3), np.uint8)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, frames):
        self.frames = frames

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return self.frames[0], {}

    def step(self, action):
        self.t += 1
        return self.frames[self.t], 0.0, self.t == len(self.frames) - 1, False, {}


def test_reference_001_crop_grayscale_downsample_and_difference():
    frame, moved, expected, expected_moved = _hand_made_frames()
    np.testing.assert_array_equal(crop80_frame(frame), expected)
    np.testing.assert_array_equal(crop80_frame(moved), expected_moved)
    gray = cv2.cvtColor(frame[34:194], cv2.COLOR_RGB2GRAY)
    area = cv2.resize(gray, (80, 80), interpolation=cv2.INTER_AREA)
    assert np.abs(area.astype(int) - crop80_frame(frame)).max() <= 1  # OpenCV agrees

    env = FrameDifference(Crop80Frame(FrameReplay([frame, moved, moved])))
    assert env.observation_space.shape == (1, 80, 80)
    obs, _ = env.reset()
    assert obs.shape == (1, 80, 80) and obs.dtype == np.float32 and not obs.any()
    obs, *_ = env.step(0)
    diff = np.zeros((80, 80), np.float32)
    diff[5, 10], diff[5, 11] = -1.0, 1.0
    np.testing.assert_allclose(obs[0], diff)
    obs, *_ = env.step(0)
    assert not obs.any()  # nothing moved
    obs, _ = env.reset()
    assert not obs.any()  # no difference across the reset

    stack = gym.wrappers.FrameStackObservation(Crop80Frame(FrameReplay([frame, moved, moved])), 4)
    obs, _ = stack.reset()
    obs, *_ = stack.step(0)
    np.testing.assert_array_equal(obs[:3], np.stack([expected] * 3))
    np.testing.assert_array_equal(obs[3], expected_moved)
