"""Frame-stacked replay: stacks rebuilt from single frames equal what the env produced, across
episode boundaries, autoreset rows and the circular wrap; and its memory per transition."""

import copy

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.wrappers import FrameStackObservation

import shoal
from shoal.core.errors import ConfigError
from shoal.data.frame_replay import bytes_per_transition, stack_size
from shoal.data.replay import ReplayBuffer

STACK = 4
FRAME = (5, 6)


class FrameEnv(gym.Env):
    """Random uint8 frames, episodes of 1 to 6 steps that end by termination or truncation
    (shorter than the stack, so stacks are often padded)."""

    observation_space = gym.spaces.Box(0, 255, FRAME, np.uint8)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.length = 0, int(self.np_random.integers(1, 7))
        return self._frame(), {}

    def step(self, action):
        self.t += 1
        end = self.t >= self.length
        truncated = end and bool(self.np_random.integers(2))
        return self._frame(), float(action) + self.t, end and not truncated, truncated, {}

    def _frame(self):
        return self.np_random.integers(0, 256, FRAME, np.uint8)


def stacked_env(padding="reset"):
    return FrameStackObservation(FrameEnv(), STACK, padding_type=padding)


def collect(padding, steps, num_envs=3, seed=0):
    """What a sampler stores for ``steps`` vector steps of a next-step-autoreset vector env:
    the observation acted on, action, reward, terminated, truncated, valid."""
    env = gym.vector.SyncVectorEnv([lambda: stacked_env(padding)] * num_envs)
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    done = np.zeros(num_envs, bool)
    rows = []
    for _ in range(steps):
        actions = rng.integers(0, 2, num_envs)
        next_obs, rewards, terminated, truncated, _ = env.step(actions)
        rows.append((obs, actions, rewards.astype(np.float32), terminated, truncated, ~done))
        done = terminated | truncated
        obs = next_obs
    env.close()
    return rows


def buffers(rows=11, num_envs=3, n_step=3, seed=0):
    space = stacked_env().observation_space
    make = lambda stack: ReplayBuffer(  # noqa: E731
        rows * num_envs,
        num_envs,
        space,
        gym.spaces.Discrete(2),
        n_step=n_step,
        seed=seed,
        frame_stack=stack,
    )
    return make(STACK), make(None)


def assert_same_batches(frames, plain, batch_size=256):
    a, b = frames.sample(batch_size), plain.sample(batch_size)
    np.testing.assert_array_equal(a.indices, b.indices)
    for name in ("obs", "next_obs", "actions", "rewards", "steps", "terminated"):
        np.testing.assert_array_equal(getattr(a, name).numpy(), getattr(b, name).numpy(), name)


@pytest.mark.parametrize("padding", ["reset", "zero"])
def test_stacks_equal_the_envs_observations(padding):
    rows = collect(padding, steps=60)
    assert any(not valid.all() for *_, valid in rows)  # autoreset rows are in the data
    frames, plain = buffers()
    for step, row in enumerate(rows):
        frames.add(*row)
        plain.add(*row)
        # Every stored row, the autoreset ones and those just past the wrap included.
        for stored in range(max(0, step + 1 - frames.rows), step + 1):
            np.testing.assert_array_equal(frames._frames.stacks_at_step(stored), rows[stored][0])
        if frames.num_sampleable():
            assert_same_batches(frames, plain)
    assert frames._rows_written > 4 * frames.rows  # wrapped around several times


def test_padding_matches_gymnasium_frame_stack():
    # FrameStackObservation pads with the reset observation by default ("reset").
    env = stacked_env()
    obs, _ = env.reset(seed=3)
    assert obs.shape == (STACK, *FRAME) and (obs == obs[-1]).all()
    zero = stacked_env("zero").reset(seed=3)[0]
    assert not zero[:-1].any()


def test_state_dict_resumes_exactly():
    rows = collect("reset", steps=50, seed=1)
    frames, plain = buffers(seed=1)
    for row in rows[:30]:
        frames.add(*row)
        plain.add(*row)
    resumed, _ = buffers(seed=1)
    resumed.load_state_dict(copy.deepcopy(frames.state_dict()))
    for row in rows[30:]:
        resumed.add(*row)
        plain.add(*row)
        assert_same_batches(resumed, plain)


def test_observations_that_are_not_frame_stacks_are_refused():
    frames, _ = buffers()
    rows = collect("reset", steps=3)
    frames.add(*rows[0])
    obs, *rest = rows[1]
    scrambled = obs[:, ::-1].copy()  # older frames that continue nothing
    with pytest.raises(ValueError, match="neither continues"):
        frames.add(scrambled, *rest)
    with pytest.raises(ValueError, match="frame_stack=3"):
        ReplayBuffer(12, 1, stacked_env().observation_space, gym.spaces.Discrete(2), frame_stack=3)
    with pytest.raises(ConfigError, match="frame_replay"):
        stack_size(gym.spaces.Discrete(3))


def atari_buffer(capacity, frame_stack):
    space = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    return ReplayBuffer(capacity, 1, space, gym.spaces.Discrete(18), frame_stack=frame_stack)


def test_atari_bytes_per_transition():
    # Measured on a 10,000-transition buffer: the frame ring's 3 extra rows add 2 bytes per
    # transition here and 0.02 at 1,000,000, so this bounds the 1M-transition figure.
    compact = bytes_per_transition(atari_buffer(10_000, 4))
    naive = bytes_per_transition(atari_buffer(10_000, None))
    assert 84 * 84 < compact <= 7_500  # one frame, action, reward, flags: ~7.1 KB, ~7 GB at 1M
    assert naive >= 4 * 84 * 84  # the whole stack: 28 KB, 28 GB at 1M


class StackedImageEnv(gym.Env):
    """[4, 36, 36] uint8 frame stacks (Gymnasium's FrameStackObservation), 5-step episodes."""

    observation_space = gym.spaces.Box(0, 255, (36, 36), np.uint8)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.np_random.integers(0, 256, (36, 36), np.uint8), {}

    def step(self, action):
        self.t += 1
        frame = self.np_random.integers(0, 256, (36, 36), np.uint8)
        return frame, float(action), self.t >= 5, False, {}


def make_stacked_image_env():
    return FrameStackObservation(StackedImageEnv(), 4)


def test_dqn_trains_on_frame_replay(registered_env, tmp_path):
    env_id = registered_env("StackedImage-v0", make_stacked_image_env)
    result = shoal.train(
        "dqn",
        env=env_id,
        seed=0,
        total_steps=64,
        run_dir=str(tmp_path / "run"),
        **{
            "frame_replay": True,
            "model.encoder": "nature",
            "env.num_envs": 2,
            "rollout_steps": 8,
            "replay.batch_size": 8,
            "replay.learning_starts": 16,
            "replay.buffer_size": 64,
            "run.eval_every_steps": 0,
            "run.checkpoint_every_steps": 0,
            "run.console": False,
            "run.tensorboard": False,
        },
    )
    assert result.env_steps == 64
