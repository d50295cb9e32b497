"""Offline datasets: Minari round trip, reading without the env, the replay layout,
normalization, replay export, recording, and the errors of bad datasets."""

import gymnasium as gym
import numpy as np
import pytest

from shoal.collect.record import exploring, random_policy, record_episodes
from shoal.config import EnvConfig
from shoal.core.errors import DatasetError
from shoal.data.offline import (
    Episode,
    dataset_env,
    episodes_from_replay,
    read_dataset,
    write_dataset,
)
from shoal.data.replay import ReplayBuffer
from shoal.envs import make_env

pytestmark = pytest.mark.extra("offline")

OBS = gym.spaces.Box(-10, 10, (3,), np.float32)
ACT = gym.spaces.Box(-2, 2, (1,), np.float32)


def episodes(lengths=(3, 5, 2, 4), seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for i, n in enumerate(lengths):
        terminated = np.zeros(n, bool)
        truncated = np.zeros(n, bool)
        (terminated if i % 2 else truncated)[-1] = True
        out.append(Episode(
            observations=rng.normal(size=(n + 1, 3)).astype(np.float32),
            actions=rng.uniform(-2, 2, (n, 1)).astype(np.float32),
            rewards=rng.normal(size=n).astype(np.float32),
            terminations=terminated, truncations=truncated,
        ))  # fmt: skip
    return out


def write(path, data=None, env=None, **kwargs):
    return write_dataset(path, data or episodes(), OBS, ACT, env or {"id": "Pendulum-v1"},
                         **kwargs)  # fmt: skip


def test_round_trip_keeps_arrays_boundaries_and_reference_scores(tmp_path):
    data = episodes()
    write(tmp_path / "d", data, ref_min_score=-100.0, ref_max_score=50.0,
          metadata={"collector": "test"})  # fmt: skip
    got = read_dataset(tmp_path / "d")
    assert len(got.episodes) == len(data) and got.num_steps == 14
    for want, have in zip(data, got.episodes, strict=True):
        for name in ("observations", "actions", "rewards", "terminations", "truncations"):
            np.testing.assert_array_equal(getattr(have, name), getattr(want, name))
    assert (got.ref_min_score, got.ref_max_score) == (-100.0, 50.0)
    assert got.normalized_score(-25.0) == pytest.approx(50.0)
    assert got.env == {"id": "Pendulum-v1"} and got.metadata["collector"] == "test"
    assert got.observation_space == OBS and got.action_space == ACT
    # Minari itself opens it
    minari = pytest.importorskip("minari")
    assert minari.MinariDataset(tmp_path / "d" / "data").total_steps == 14


def test_a_dataset_reads_without_its_env(tmp_path):
    write(tmp_path / "d", env={"id": "NoSuchEnv-v9", "kwargs": {"size": 3}})
    got = read_dataset(tmp_path / "d")  # no env is built: the spaces come from the dataset
    assert got.observation_space == OBS and got.env_id == "NoSuchEnv-v9"
    assert dataset_env(tmp_path / "d") == {"id": "NoSuchEnv-v9", "kwargs": {"size": 3}}
    assert got.normalized_score(0.0) is None  # no reference scores recorded


def test_replay_layout_gives_every_transition_with_its_next_observation(tmp_path):
    data = episodes(lengths=(3, 5, 2, 4, 1, 6))
    write(tmp_path / "d", data)
    dataset = read_dataset(tmp_path / "d")
    transitions = {
        (tuple(e.observations[t]), tuple(e.observations[t + 1]), float(e.rewards[t]),
         bool(e.terminations[t]))
        for e in data for t in range(len(e))
    }  # fmt: skip
    for num_envs in (1, 3):
        replay = dataset.to_replay(num_envs=num_envs)
        assert replay.num_sampleable() == dataset.num_steps
        positions = np.flatnonzero(replay.valid.ravel())
        batch = replay.windows(positions)
        got = {
            (tuple(o), tuple(n), float(r[0]), bool(d))
            for o, n, r, d in zip(batch.obs.numpy(), batch.next_obs.numpy(),
                                  batch.rewards.numpy(), batch.terminated.numpy(), strict=True)
        }  # fmt: skip
        assert got == transitions


def test_replay_n_step_windows_stop_at_episode_ends(tmp_path):
    data = episodes(lengths=(3, 2))
    write(tmp_path / "d", data)
    replay = read_dataset(tmp_path / "d").to_replay(num_envs=1, n_step=3)
    batch = replay.windows(np.array([0, 4]))  # the first step of each episode
    assert batch.steps.tolist() == [3, 2]
    np.testing.assert_allclose(batch.rewards[1, :2].numpy(), data[1].rewards)
    assert batch.rewards[1, 2].item() == 0.0
    np.testing.assert_array_equal(batch.next_obs[1].numpy(), data[1].observations[-1])
    assert batch.terminated.tolist() == [False, True]


def test_normalization_uses_the_dataset_statistics(tmp_path):
    data = episodes()
    write(tmp_path / "d", data)
    dataset = read_dataset(tmp_path / "d")
    stats = dataset.obs_stats()
    observed = np.concatenate([e.observations[:-1] for e in data])
    np.testing.assert_allclose(stats["mean"], observed.mean(0), rtol=1e-5)
    np.testing.assert_allclose(stats["var"], observed.var(0), rtol=1e-4)
    replay = dataset.to_replay(obs_stats=stats, clip_obs=10.0)
    first = replay.windows(np.array([0])).obs[0].numpy()
    want = (data[0].observations[0] - observed.mean(0)) / np.sqrt(observed.var(0) + 1e-8)
    np.testing.assert_allclose(first, want, rtol=1e-4)


def test_bad_datasets_give_clear_errors(tmp_path):
    with pytest.raises(DatasetError, match="no dataset at"):
        read_dataset(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetError, match="not a Minari dataset"):
        read_dataset(tmp_path / "empty")
    write(tmp_path / "d")
    (tmp_path / "d" / "data" / "main_data.hdf5").write_bytes(b"not hdf5 at all")
    with pytest.raises(DatasetError, match="cannot read the dataset"):
        read_dataset(tmp_path / "d")
    with pytest.raises(DatasetError, match="exists"):
        write(tmp_path / "d")


def test_replay_export_returns_the_stored_episodes():
    """Two envs' steps with next-step autoreset, as a sampler stores them, back to episodes."""
    replay = ReplayBuffer(64, 2, OBS, ACT)
    lengths = [(3, 4), (2, 5)]  # env 0: episodes of 3 then 2 steps; env 1: 4 then 5
    streams = []
    rng = np.random.default_rng(1)
    for b in range(2):
        rows = []
        for n in (lengths[0][b], lengths[1][b]):
            obs = rng.normal(size=(n + 1, 3)).astype(np.float32)
            for t in range(n):
                rows.append((obs[t], t, t == n - 1, True))
            rows.append((obs[n], 0, False, False))  # the autoreset row: the final observation
        streams.append(rows)
    for t in range(max(len(s) for s in streams)):
        rows = [s[t] if t < len(s) else (np.zeros(3, np.float32), 0, False, False)
                for s in streams]  # fmt: skip
        replay.add(np.stack([r[0] for r in rows]), np.full((2, 1), t, np.float32),
                   np.array([r[1] for r in rows], np.float32), np.array([r[2] for r in rows]),
                   np.zeros(2, bool), np.array([r[3] for r in rows]))  # fmt: skip
    got = episodes_from_replay(replay.state_dict())
    assert sorted(len(e) for e in got) == [2, 3, 4, 5]
    for e in got:
        assert e.terminations[-1] and len(e.observations) == len(e) + 1
        np.testing.assert_array_equal(e.rewards, np.arange(len(e)))


def test_record_episodes_keeps_whole_episodes_with_final_observations():
    env = make_env(EnvConfig(id="CartPole-v1", num_envs=3))
    act = random_policy(env.action_space, seed=0)
    got = record_episodes(act, env, 7, seed=0)
    env.close()
    assert len(got) == 7
    for e in got:
        assert len(e.observations) == len(e) + 1
        assert e.terminations[-1] or e.truncations[-1]
        assert not (e.terminations[:-1] | e.truncations[:-1]).any()
        assert np.all(e.rewards == 1.0)
        assert abs(e.observations[-1][2]) > 0.2 or abs(e.observations[-1][0]) > 2.4  # fell


def test_exploring_adds_bounded_noise_and_random_actions():
    space = gym.spaces.Box(-2, 2, (2,), np.float32)
    zero = exploring(lambda obs: np.zeros((len(obs), 2), np.float32), space, 0.5, 0.0, 0)
    actions = zero(np.zeros((5000, 1)))
    assert actions.min() >= -2 and actions.max() <= 2
    assert actions.std() == pytest.approx(1.0, rel=0.1)  # 0.5 of the half range 2
    discrete = gym.spaces.Discrete(4)
    mixed = exploring(lambda obs: np.zeros(len(obs), np.int64), discrete, 0.0, 0.5, 0)
    share = (mixed(np.zeros((4000, 1))) != 0).mean()
    assert share == pytest.approx(0.5 * 3 / 4, abs=0.03)
