"""GymVectorEnv (the Gymnasium adapter) and the normalization wrappers."""

import gymnasium as gym
import numpy as np
import pytest

import shoal
from shoal.config import EnvConfig
from shoal.core.errors import ConfigError, UnknownEnvError
from shoal.envs import (
    GymVectorEnv,
    NormalizeObservation,
    NormalizeReward,
    RunningMeanStd,
    VectorEnvWrapper,
    make_env,
)
from shoal.envs.normalize import normalize

# (id, vectorization): CartPole has a native vector implementation, Pendulum does not.
ADAPTER_CASES = [
    ("CartPole-v1", "native"),
    ("CartPole-v1", "sync"),
    ("Pendulum-v1", "sync"),
]


def zero_actions(env):
    space = env.action_space
    if isinstance(space, gym.spaces.Discrete):
        return np.zeros(env.num_envs, np.int64)
    return np.zeros((env.num_envs, *space.shape), space.dtype)


def random_actions(env, rng):
    space = env.action_space
    if isinstance(space, gym.spaces.Discrete):
        return rng.integers(space.n, size=env.num_envs)
    return rng.uniform(space.low, space.high, (env.num_envs, *space.shape)).astype(space.dtype)


def test_make_env_builds_the_adapter():
    env = shoal.make_env("CartPole-v1", num_envs=3)
    try:
        assert isinstance(env, GymVectorEnv)
        assert env.num_envs == 3
        # Spaces describe one environment; arrays carry the [num_envs] axis.
        assert env.observation_space.shape == (4,)
        assert isinstance(env.action_space, gym.spaces.Discrete)
        obs = env.reset(seed=0)
        assert obs.shape == (3, 4)
        # auto picks CartPole's native vector implementation.
        assert not isinstance(env.env, gym.vector.SyncVectorEnv)
    finally:
        env.close()


@pytest.mark.parametrize(("env_id", "vectorization"), ADAPTER_CASES)
def test_next_step_autoreset_and_episode_statistics(env_id, vectorization, monkeypatch):
    env = shoal.make_env(env_id, num_envs=3, max_episode_steps=5, vectorization=vectorization)
    # A bonus on every reward, the autoreset steps included: those must still not be counted.
    inner_step = env.env.step

    def step_with_bonus(actions):
        obs, reward, terminated, truncated, info = inner_step(actions)
        return obs, reward + 100.0, terminated, truncated, info

    monkeypatch.setattr(env.env, "step", step_with_bonus)
    rng = np.random.default_rng(0)
    env.reset(seed=11)
    running_return = np.zeros(3)
    running_length = np.zeros(3, np.int64)
    previous_done = np.zeros(3, bool)
    episodes = 0
    for _ in range(20):
        result = env.step(random_actions(env, rng))
        assert result.obs.shape == (3, *env.observation_space.shape)
        assert result.reward.dtype == np.float32
        # The step after an episode end is an autoreset step, and only that one.
        np.testing.assert_array_equal(result.autoreset, previous_done)
        done = result.terminated | result.truncated
        assert not (done & result.autoreset).any()
        running_return = np.where(result.autoreset, 0.0, running_return + result.reward)
        running_length = np.where(result.autoreset, 0, running_length + 1)
        np.testing.assert_allclose(result.episode_returns, running_return[done], rtol=1e-6)
        np.testing.assert_array_equal(result.episode_lengths, running_length[done])
        assert (result.episode_lengths <= 5).all()
        episodes += int(done.sum())
        previous_done = done
    env.close()
    assert episodes >= 3  # at most 5 real steps per episode: every env finished some


def test_truncated_step_returns_the_true_final_observation_sync():
    seed = 5
    env = shoal.make_env("CartPole-v1", num_envs=2, max_episode_steps=5, vectorization="sync")
    single = gym.make("CartPole-v1", max_episode_steps=5)
    # SyncVectorEnv seeds env i with seed + i, so env 0 must replay the single env exactly.
    vec_obs = [env.reset(seed=seed)[0]]
    single_obs = [single.reset(seed=seed)[0]]
    results = []
    for _ in range(5):
        results.append(env.step(np.zeros(2, np.int64)))
        vec_obs.append(results[-1].obs[0])
        obs, _, terminated, truncated, _ = single.step(0)
        single_obs.append(obs)
    assert truncated and not terminated
    final = results[-1]
    assert final.truncated.all() and not final.terminated.any()
    np.testing.assert_array_equal(np.stack(vec_obs), np.stack(single_obs))

    after = env.step(np.zeros(2, np.int64))
    assert after.autoreset.all()
    # The autoreset step shows the next episode's first observation, not the final one; the
    # single env reset without a seed draws the same next initial state.
    assert not np.allclose(after.obs[0], final.obs[0])
    np.testing.assert_array_equal(after.obs[0], single.reset()[0])
    env.close()
    single.close()


def test_truncated_step_returns_the_true_final_observation_native():
    env = shoal.make_env("CartPole-v1", num_envs=3, max_episode_steps=5, vectorization="native")
    previous = env.reset(seed=5)
    for _ in range(5):
        actions = np.array([0, 1, 0])
        result = env.step(actions)
        # Continuity: the observation is one physics step on from the previous one, checked by
        # stepping a single CartPole from the same state with the same action.
        for i in range(3):
            single = gym.make("CartPole-v1").unwrapped
            single.reset(seed=0)
            single.state = previous[i].astype(np.float64)
            expected, *_ = single.step(int(actions[i]))
            np.testing.assert_allclose(result.obs[i], expected, rtol=1e-5, atol=1e-6)
        previous = result.obs
    assert result.truncated.all() and not result.terminated.any()
    after = env.step(np.zeros(3, np.int64))
    assert after.autoreset.all()
    assert not np.allclose(after.obs, result.obs)
    # Reset states of CartPole are drawn from [-0.05, 0.05].
    assert np.abs(after.obs).max() <= 0.05
    env.close()


def test_unknown_env_id_lists_close_matches():
    with pytest.raises(UnknownEnvError, match="CartPole-v1"):
        shoal.make_env("CartPol-v1")


def test_native_vectorization_without_native_implementation_is_a_config_error():
    with pytest.raises(ConfigError, match=r"vectorization.*Pendulum-v1"):
        shoal.make_env("Pendulum-v1", num_envs=2, vectorization="native")


def test_box_actions_are_clipped_to_bounds(monkeypatch):
    env = shoal.make_env("Pendulum-v1", num_envs=3, vectorization="sync")
    reference = shoal.make_env("Pendulum-v1", num_envs=3, vectorization="sync")
    seen = []
    inner_step = env.env.step
    monkeypatch.setattr(env.env, "step", lambda a: (seen.append(np.array(a)), inner_step(a))[1])
    env.reset(seed=3)
    reference.reset(seed=3)
    wild = np.array([[100.0], [-7.5], [0.5]], np.float32)
    clipped = np.array([[2.0], [-2.0], [0.5]], np.float32)
    got = env.step(wild)
    want = reference.step(clipped)
    np.testing.assert_array_equal(seen[0], clipped)
    np.testing.assert_array_equal(got.obs, want.obs)
    np.testing.assert_array_equal(got.reward, want.reward)
    env.close()
    reference.close()


# --- normalization ------------------------------------------------------------------------------


class Recorder(VectorEnvWrapper):
    """Records the raw observations and step results the wrapped env produces."""

    def __init__(self, env):
        super().__init__(env)
        self.obs = []
        self.results = []

    def reset(self, seed=None):
        obs = self.env.reset(seed=seed)
        self.obs.append(obs.copy())
        return obs

    def step(self, actions):
        result = self.env.step(actions)
        self.obs.append(result.obs.copy())
        self.results.append(result)
        return result


def normalized_obs_env(env_id="CartPole-v1", num_envs=4, **kwargs):
    env = make_env(EnvConfig(id=env_id, num_envs=num_envs, normalize_obs=True, **kwargs))
    assert isinstance(env, NormalizeObservation)
    env.env = Recorder(env.env)
    return env


def test_normalize_observation_statistics_match_numpy():
    env = normalized_obs_env()
    rng = np.random.default_rng(0)
    out = env.reset(seed=0)
    for _ in range(60):
        out = env.step(random_actions(env, rng)).obs
    seen = np.concatenate(env.env.obs)
    assert seen.shape == (61 * 4, 4)
    np.testing.assert_allclose(env.stats.mean, seen.mean(0), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(env.stats.var, seen.var(0), rtol=1e-4, atol=1e-6)
    assert env.stats.count == pytest.approx(seen.shape[0], abs=1e-3)
    # The returned observations are standardized with the statistics including this step.
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, normalize(env.env.obs[-1], env.stats, env.clip), rtol=1e-6)
    env.close()


def test_normalize_observation_frozen_when_not_training():
    env = normalized_obs_env()
    rng = np.random.default_rng(1)
    env.reset(seed=0)
    for _ in range(10):
        env.step(random_actions(env, rng))
    frozen = env.stats.state_dict()
    env.training = False
    for _ in range(10):
        out = env.step(random_actions(env, rng)).obs
    after = env.stats.state_dict()
    np.testing.assert_array_equal(after["mean"], frozen["mean"])
    np.testing.assert_array_equal(after["var"], frozen["var"])
    assert after["count"] == frozen["count"]
    np.testing.assert_allclose(out, normalize(env.env.obs[-1], env.stats, env.clip), rtol=1e-6)
    env.close()


def test_normalize_reward_statistics_match_numpy():
    gamma = 0.9
    config = EnvConfig(
        id="Pendulum-v1", num_envs=3, normalize_reward=True, gamma=gamma, max_episode_steps=7
    )
    env = make_env(config)
    assert isinstance(env, NormalizeReward)
    env.env = Recorder(env.env)
    rng = np.random.default_rng(2)
    env.reset(seed=0)
    scaled = [env.step(random_actions(env, rng)) for _ in range(30)]

    discounted = np.zeros(3)
    seen = []
    for raw in env.env.results:
        discounted = discounted * gamma + raw.reward
        seen.append(discounted.copy())
        discounted[raw.terminated | raw.truncated] = 0.0
    seen = np.concatenate(seen)
    np.testing.assert_allclose(env.stats.mean, seen.mean(), rtol=1e-4)
    np.testing.assert_allclose(env.stats.var, seen.var(), rtol=1e-4)

    last_raw, last = env.env.results[-1], scaled[-1]
    expected = np.clip(last_raw.reward / np.sqrt(env.stats.var + 1e-8), -10, 10)
    np.testing.assert_allclose(last.reward, expected, rtol=1e-5)
    # Episode statistics stay in raw reward units.
    for raw, out in zip(env.env.results, scaled, strict=True):
        np.testing.assert_array_equal(out.episode_returns, raw.episode_returns)
    env.close()


def test_normalize_reward_frozen_when_not_training():
    env = make_env(EnvConfig(id="Pendulum-v1", num_envs=2, normalize_reward=True))
    rng = np.random.default_rng(3)
    env.reset(seed=0)
    for _ in range(5):
        env.step(random_actions(env, rng))
    frozen = env.stats.state_dict()
    env.training = False
    for _ in range(5):
        env.step(random_actions(env, rng))
    assert env.stats.state_dict()["var"] == frozen["var"]
    assert env.stats.state_dict()["count"] == frozen["count"]
    env.close()


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_normalizer_state_round_trip_continues_identically(env_id):
    config = EnvConfig(id=env_id, num_envs=3, normalize_obs=True, normalize_reward=True)
    env = make_env(config)
    rng = np.random.default_rng(4)
    env.reset(seed=0)
    for _ in range(15):
        env.step(random_actions(env, rng))
    state = env.get_state()

    fresh = make_env(config)
    fresh.reset(seed=99)
    fresh.set_state(state)
    reward_wrapper, obs_wrapper = fresh, fresh.env
    assert isinstance(obs_wrapper, NormalizeObservation)
    np.testing.assert_array_equal(obs_wrapper.stats.mean, env.env.stats.mean)
    np.testing.assert_array_equal(obs_wrapper.stats.var, env.env.stats.var)
    assert obs_wrapper.stats.count == env.env.stats.count
    np.testing.assert_array_equal(reward_wrapper.stats.var, env.stats.var)
    np.testing.assert_array_equal(reward_wrapper.discounted, env.discounted)

    for _ in range(15):
        actions = random_actions(env, rng)
        want, got = env.step(actions), fresh.step(actions)
        np.testing.assert_array_equal(got.obs, want.obs)
        np.testing.assert_array_equal(got.reward, want.reward)
        np.testing.assert_array_equal(got.autoreset, want.autoreset)
    env.close()
    fresh.close()


def test_running_mean_std_parallel_update_equals_numpy():
    rng = np.random.default_rng(5)
    batches = [rng.normal(3.0, 2.0, (n, 3)) for n in (1, 7, 50, 13)]
    stats = RunningMeanStd((3,), epsilon=0.0)
    for batch in batches:
        stats.update(batch)
    everything = np.concatenate(batches)
    np.testing.assert_allclose(stats.mean, everything.mean(0), rtol=1e-12)
    np.testing.assert_allclose(stats.var, everything.var(0), rtol=1e-12)
    assert stats.count == everything.shape[0]


def test_running_mean_std_default_prior_is_negligible():
    rng = np.random.default_rng(6)
    batches = [rng.normal(-1.0, 0.5, n) for n in (4, 9)]
    stats = RunningMeanStd(())
    for batch in batches:
        stats.update(batch)
    everything = np.concatenate(batches)
    np.testing.assert_allclose(stats.mean, everything.mean(), rtol=1e-4)
    np.testing.assert_allclose(stats.var, everything.var(), rtol=1e-4)


def test_running_mean_std_state_dict_holds_arrays_and_round_trips():
    stats = RunningMeanStd(())
    stats.update(np.array([1.0, 2.0, 4.0]))
    state = stats.state_dict()
    # Scalar statistics must stay arrays: checkpoints store arrays, not numpy scalars.
    assert isinstance(state["mean"], np.ndarray) and state["mean"].shape == ()
    assert isinstance(state["var"], np.ndarray) and state["var"].dtype == np.float64
    copy = RunningMeanStd(())
    copy.load_state_dict(state)
    assert copy.mean == stats.mean and copy.var == stats.var and copy.count == stats.count
    # The state is a copy, not a view of the live statistics.
    stats.update(np.array([100.0]))
    assert copy.mean != stats.mean
