"""Env snapshots must let a run resume bit-for-bit: N steps + restore + M steps == N + M steps."""

import io

import gymnasium as gym
import numpy as np
import pytest
import torch

from shoal.envs.snapshot import EnvStateUnsupported, capture_env_state, restore_env_state

WARMUP_STEPS = 37
RESUMED_STEPS = 60


def make_cartpole():
    return gym.make_vec("CartPole-v1", num_envs=8, vectorization_mode="vector_entry_point")


def make_pendulum():
    return gym.make_vec("Pendulum-v1", num_envs=3, vectorization_mode="sync")


def make_mountain_car():
    return gym.make_vec("MountainCar-v0", 4, vectorization_mode="sync")


def make_acrobot():
    return gym.make_vec("Acrobot-v1", num_envs=2, vectorization_mode="sync")


MAKERS = {
    "cartpole-native": make_cartpole,
    "pendulum-sync": make_pendulum,
    "mountaincar-sync": make_mountain_car,
    "acrobot-sync": make_acrobot,
}


def random_actions(env, count, seed):
    """Actions from our own seeded rng, not action_space.sample(), whose rng is not snapshotted."""
    rng = np.random.default_rng(seed)
    space = env.action_space
    if isinstance(space, gym.spaces.MultiDiscrete):
        return [rng.integers(space.nvec) for _ in range(count)]
    if isinstance(space, gym.spaces.Box):
        return [rng.uniform(space.low, space.high).astype(space.dtype) for _ in range(count)]
    raise AssertionError(f"no action sampler for {space}")


def run(env, actions):
    """Step through ``actions``, returning copies of every output except info."""
    outputs = []
    for action in actions:
        obs, reward, terminated, truncated, _ = env.step(action)
        outputs.append(tuple(np.array(x) for x in (obs, reward, terminated, truncated)))
    return outputs


def through_torch_checkpoint(state):
    """Arrays -> tensors -> torch.save/torch.load(weights_only=True) -> arrays."""

    def convert(value, fn, kind):
        if isinstance(value, dict):
            return {key: convert(item, fn, kind) for key, item in value.items()}
        if isinstance(value, list):
            return [convert(item, fn, kind) for item in value]
        return fn(value) if isinstance(value, kind) else value

    buffer = io.BytesIO()
    torch.save(convert(state, torch.from_numpy, np.ndarray), buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)
    return convert(loaded, torch.Tensor.numpy, torch.Tensor)


def assert_plain(value, path="state"):
    """Only the types a weights_only checkpoint (after array -> tensor) can hold."""
    if isinstance(value, dict):
        for key, item in value.items():
            assert isinstance(key, str), path
            assert_plain(item, f"{path}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            assert_plain(item, f"{path}[{i}]")
    else:
        assert value is None or type(value) in (str, int, float, bool, np.ndarray), (
            f"{path}: {type(value)}"
        )


@pytest.mark.parametrize("via_torch", [False, True], ids=["direct", "via-torch"])
@pytest.mark.parametrize("name", list(MAKERS))
def test_resume_matches_uninterrupted_run(name, via_torch):
    make = MAKERS[name]
    env = make()
    actions = random_actions(env, WARMUP_STEPS + RESUMED_STEPS, seed=7)
    env.reset(seed=123)
    warmup = run(env, actions[:WARMUP_STEPS])
    state = capture_env_state(env)
    expected = run(env, actions[WARMUP_STEPS:])
    env.close()

    if name == "cartpole-native":
        # The window must cross episode boundaries, so autoreset (and its rng draws) is covered.
        assert any(terminated.any() for _, _, terminated, _ in warmup)
        assert any(terminated.any() for _, _, terminated, _ in expected)

    assert_plain(state)
    if via_torch:
        state = through_torch_checkpoint(state)

    fresh = make()
    fresh.reset(seed=999)
    restore_env_state(fresh, state)
    resumed = run(fresh, actions[WARMUP_STEPS:])
    fresh.close()

    for step, (want, got) in enumerate(zip(expected, resumed, strict=True)):
        for field, a, b in zip(
            ("obs", "reward", "terminated", "truncated"), want, got, strict=True
        ):
            assert a.dtype == b.dtype and np.array_equal(a, b), f"step {step}: {field} differs"


def test_capture_is_a_copy():
    env = make_cartpole()
    env.reset(seed=0)
    state = capture_env_state(env)
    saved = state["root"]["attrs"]["state"].copy()
    run(env, random_actions(env, 5, seed=0))
    assert np.array_equal(state["root"]["attrs"]["state"], saved)
    env.close()


class TupleStateEnv(gym.Env):
    """Holds the awkward kinds of state: a tuple, numpy scalars, a list, an rng."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float64)
    action_space = gym.spaces.Discrete(2)

    def __init__(self):
        self.state = None
        self.count = np.int64(0)
        self.history = []

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.state = (float(self.np_random.normal()), np.float32(0.5), (True, None))
        return np.array([self.state[0]]), {}

    def step(self, action):
        x, scale, flags = self.state
        self.state = (x + float(self.np_random.normal()) * float(scale), scale, flags)
        self.count += 1
        self.history.append(int(action))
        return np.array([self.state[0]]), 0.0, False, False, {}


def test_tuples_numpy_scalars_and_rng_round_trip():
    env = TupleStateEnv()
    env.reset(seed=1)
    for action in (0, 1, 1):
        env.step(action)
    state = through_torch_checkpoint(capture_env_state(env))

    fresh = TupleStateEnv()
    fresh.reset(seed=2)
    restore_env_state(fresh, state)
    assert type(fresh.state) is tuple and type(fresh.state[2]) is tuple
    assert fresh.state == env.state
    assert type(fresh.state[1]) is np.float32
    assert type(fresh.count) is np.int64 and fresh.count == 3
    assert fresh.history == [0, 1, 1]
    assert fresh.step(0)[0] == env.step(0)[0]


def test_restore_into_different_env_names_path():
    source = make_cartpole()
    source.reset(seed=0)
    state = capture_env_state(source)
    source.close()

    target = make_pendulum()
    with pytest.raises(ValueError, match=r"^env: "):
        restore_env_state(target, state)
    target.close()


def test_shape_mismatch_names_path():
    source = make_cartpole()
    source.reset(seed=0)
    state = capture_env_state(source)
    source.close()

    target = gym.make_vec("CartPole-v1", num_envs=4, vectorization_mode="vector_entry_point")
    target.reset(seed=0)
    with pytest.raises(ValueError, match=r"env\.state: .*shape"):
        restore_env_state(target, state)
    target.close()


def test_failed_restore_leaves_env_untouched():
    source = make_pendulum()
    source.reset(seed=0)
    state = capture_env_state(source)
    source.close()
    # Break the last sub-env only; the earlier ones must not have been written either.
    last = state["root"]["children"]["envs"][-1]
    while "env" in last["children"]:
        last = last["children"]["env"]
    last["attrs"]["state"] = np.zeros(5)

    target = make_pendulum()
    target.reset(seed=1)
    before = [sub.unwrapped.state.copy() for sub in target.envs]
    with pytest.raises(ValueError, match=r"env\.envs\[2\](\.env)+\.state: "):
        restore_env_state(target, state)
    for sub, old in zip(target.envs, before, strict=True):
        assert np.array_equal(sub.unwrapped.state, old)
    target.close()


def test_async_vector_env_is_unsupported():
    env = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="async")
    try:
        with pytest.raises(EnvStateUnsupported, match="restarts"):
            capture_env_state(env)
    finally:
        env.close()


def test_native_simulator_env_is_unsupported():
    class FakeMujocoEnv(TupleStateEnv):
        pass

    # Real MuJoCo is not a test dependency; the module name is what the check looks at.
    FakeMujocoEnv.__module__ = "gymnasium.envs.mujoco.fake"
    with pytest.raises(EnvStateUnsupported, match=r"env\.env.*restarts"):
        capture_env_state(gym.wrappers.TimeLimit(FakeMujocoEnv(), 10))
