"""ReplayBuffer: storage layout, n-step windows, wrap-around, priorities and checkpoints."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from shoal.data import ProportionalPriorities, RankBasedPriorities, ReplayBuffer
from shoal.train.checkpoint import load_checkpoint, save_checkpoint

OBS = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
DISCRETE = gym.spaces.Discrete(3)


def add_step(buf, obs_id, reward=0.0, term=False, trunc=False, valid=True, mask=None):
    """One step of a single-env buffer whose observation is ``[obs_id, 0]``."""
    buf.add(
        np.array([[obs_id, 0.0]], np.float32),
        np.array([obs_id % 3]),
        np.array([reward], np.float32),
        np.array([term]),
        np.array([trunc]),
        np.array([valid]),
        None if mask is None else np.array([mask]),
    )


def by_start(batch):
    """``{obs id of the sampled row: (K, rewards, terminated, next obs id)}``."""
    return {
        int(o[0]): (int(k), r.tolist(), bool(d), int(no[0]))
        for o, k, r, d, no in zip(
            batch.obs, batch.steps, batch.rewards, batch.terminated, batch.next_obs, strict=True
        )
    }


def episode_buffer(n_step, **kwargs):
    """One env: an episode that terminates, one that is truncated, one still running.
    Rows (obs id: reward, end): 10:1, 11:2, 12:3 terminated, 13 autoreset (final obs),
    20:10, 21:20 truncated, 22 autoreset (final obs), 30:100, 31:200, 32:300, 33:400, 34:500."""
    buf = ReplayBuffer(64, 1, OBS, DISCRETE, n_step=n_step, **kwargs)
    add_step(buf, 10, 1.0)
    add_step(buf, 11, 2.0)
    add_step(buf, 12, 3.0, term=True)
    add_step(buf, 13, valid=False)
    add_step(buf, 20, 10.0)
    add_step(buf, 21, 20.0, trunc=True)
    add_step(buf, 22, valid=False)
    for i, r in enumerate([100.0, 200.0, 300.0, 400.0, 500.0]):
        add_step(buf, 30 + i, r)
    return buf


def test_n_step_windows_stop_at_episode_ends():
    buf = episode_buffer(n_step=3)
    got = by_start(buf.sample(400))
    assert got == {
        10: (3, [1.0, 2.0, 3.0], True, 13),
        11: (2, [2.0, 3.0, 0.0], True, 13),
        12: (1, [3.0, 0.0, 0.0], True, 13),
        20: (2, [10.0, 20.0, 0.0], False, 22),  # truncated: bootstrap from the final obs
        21: (1, [20.0, 0.0, 0.0], False, 22),
        30: (3, [100.0, 200.0, 300.0], False, 33),  # no end: exactly n steps
        31: (3, [200.0, 300.0, 400.0], False, 34),
    }  # autoreset rows 13, 22 and the newest n rows 32-34 are never sampled
    assert buf.num_sampleable() == 7 and len(buf) == 12


def test_one_step_terminated_vs_truncated():
    got = by_start(episode_buffer(n_step=1).sample(400))
    assert got[12] == (1, [3.0], True, 13)
    assert got[21] == (1, [20.0], False, 22)
    assert got[11] == (1, [2.0], False, 12)
    assert 13 not in got and 22 not in got and 34 not in got


@pytest.mark.parametrize("n_step", [1, 3])
def test_cut_episodes_truncate_before_the_newest_step(n_step):
    """A runner replaced after step 34 lost what followed it: 34 becomes the autoreset row of
    an episode truncated at 33, and the replacement's steps (40, 41, ...) start a new one."""
    buf = episode_buffer(n_step=n_step)
    buf.cut_episodes([0])
    for i, r in enumerate([1000.0, 2000.0, 3000.0, 4000.0]):
        add_step(buf, 40 + i, r)
    got = by_start(buf.sample(600))
    assert 34 not in got
    if n_step == 3:
        assert got[31] == (3, [200.0, 300.0, 400.0], False, 34)
        assert got[32] == (2, [300.0, 400.0, 0.0], False, 34)  # truncated at 33
        assert got[33] == (1, [400.0, 0.0, 0.0], False, 34)
        assert got[40] == (3, [1000.0, 2000.0, 3000.0], False, 43)
    else:
        assert got[33] == (1, [400.0], False, 34)
        assert got[40] == (1, [1000.0], False, 41)
    buf.cut_episodes([])  # nothing to cut
    assert ReplayBuffer(8, 1, OBS, DISCRETE).cut_episodes([0]) is None  # empty: no-op


def test_newest_n_rows_not_sampleable():
    buf = ReplayBuffer(16, 1, OBS, DISCRETE, n_step=3)
    for i in range(3):
        add_step(buf, i)
        assert buf.num_sampleable() == 0
    with pytest.raises(ValueError, match="no sampleable transition"):
        buf.sample(1)
    add_step(buf, 3)
    assert buf.num_sampleable() == 1
    assert buf.sample(8).obs[:, 0].tolist() == [0.0] * 8


@pytest.mark.parametrize("prioritized", [False, True])
def test_wrap_around_never_samples_overwritten_rows(prioritized):
    prios = ProportionalPriorities(6) if prioritized else None
    buf = ReplayBuffer(6, 1, OBS, DISCRETE, n_step=2, priorities=prios)
    for step in range(30):
        add_step(buf, step)
        if step >= 2:
            ids = buf.sample(64).obs[:, 0].numpy()
            # rows step-5..step are stored; the oldest still has its window; newest 2 wait
            assert ids.min() >= max(0, step - 5) and ids.max() <= step - 2
    assert len(buf) == 6 and buf.num_sampleable() == 4
    assert set(buf.sample(256).obs[:, 0].tolist()) == {24.0, 25.0, 26.0, 27.0}
    if prioritized:
        assert prios.num_active == 4


def test_next_obs_found_by_index_not_stored_twice():
    buf = ReplayBuffer(10, 2, OBS, DISCRETE)
    obs_arrays = [k for k, v in vars(buf).items() if isinstance(v, np.ndarray) and v.ndim == 3]
    assert obs_arrays == ["obs"]
    assert buf.obs.shape == (5, 2, 2)


def test_uint8_observations_stay_uint8():
    frames = gym.spaces.Box(0, 255, (4, 5, 3), np.uint8)
    buf = ReplayBuffer(8, 2, frames, DISCRETE)
    assert buf.obs.dtype == np.uint8
    for i in range(3):
        buf.add(
            np.full((2, 4, 5, 3), 200 + i, np.uint8),
            np.zeros(2, np.int64),
            np.zeros(2),
            np.zeros(2, bool),
            np.zeros(2, bool),
            np.ones(2, bool),
        )
    batch = buf.sample(4)
    assert batch.obs.dtype == torch.uint8 and batch.next_obs.dtype == torch.uint8
    assert batch.actions.dtype == torch.int64 and batch.obs.shape == (4, 4, 5, 3)
    assert (batch.next_obs.int() - batch.obs.int() == 1).all()


def test_action_masks_gathered_at_window_end():
    buf = ReplayBuffer(64, 1, OBS, DISCRETE, n_step=2, action_mask_dim=3)
    masks = {0: [1, 0, 0], 1: [0, 1, 0], 2: [0, 0, 1], 3: [1, 1, 0], 4: [0, 1, 1], 5: [1, 1, 1]}
    add_step(buf, 0, mask=masks[0])
    add_step(buf, 1, term=True, mask=masks[1])
    add_step(buf, 2, valid=False, mask=masks[2])  # final obs of the episode and its mask
    add_step(buf, 3, mask=masks[3])
    add_step(buf, 4, mask=masks[4])
    add_step(buf, 5, mask=masks[5])
    batch = buf.sample(200)
    expected_next = {0: 2, 1: 2, 3: 5}  # K = 2, 1, 2
    for obs, nxt, mask in zip(batch.obs, batch.next_obs, batch.next_action_mask, strict=True):
        start = int(obs[0])
        assert int(nxt[0]) == expected_next[start]
        assert mask.tolist() == [bool(m) for m in masks[expected_next[start]]]
    assert batch.next_action_mask.dtype == torch.bool
    with pytest.raises(ValueError, match="action_mask"):
        add_step(buf, 6)


def random_stream(steps, num_envs, seed):
    """Per-env streams with random episode ends and the autoreset row after each end; the
    observation encodes (step, env) so every sample can be traced back."""
    rng = np.random.default_rng(seed)
    fields = {k: [] for k in ("obs", "actions", "rewards", "term", "trunc", "valid", "mask")}
    was_end = np.zeros(num_envs, bool)
    for t in range(steps):
        end = rng.random(num_envs) < 0.25
        term = end & (rng.random(num_envs) < 0.5) & ~was_end
        trunc = end & ~term & ~was_end
        fields["obs"].append(np.stack([np.full(num_envs, t), np.arange(num_envs)], 1))
        fields["actions"].append(rng.integers(0, 3, num_envs))
        fields["rewards"].append(np.where(was_end, 0.0, rng.normal(size=num_envs)))
        fields["term"].append(term)
        fields["trunc"].append(trunc)
        fields["valid"].append(~was_end)
        fields["mask"].append(rng.random((num_envs, 3)) < 0.5)
        was_end = term | trunc
    return {k: np.stack(v) for k, v in fields.items()}


def reference_window(stream, t, env, n):
    """The n-step window of step ``t`` of ``env`` by a plain loop."""
    rewards, k = [0.0] * n, 0
    for k in range(1, n + 1):
        rewards[k - 1] = float(stream["rewards"][t + k - 1, env])
        if stream["term"][t + k - 1, env] or stream["trunc"][t + k - 1, env]:
            break
    return k, rewards, bool(stream["term"][t + k - 1, env]), t + k


@pytest.mark.parametrize("prioritized", [False, True])
def test_interleaved_envs_match_reference_loop(prioritized):
    num_envs, n, steps, rows = 3, 3, 40, 16
    stream = random_stream(steps, num_envs, seed=1)
    prios = ProportionalPriorities(rows * num_envs) if prioritized else None
    buf = ReplayBuffer(rows * num_envs, num_envs, OBS, DISCRETE, n, 3, prios, seed=2)
    buf.extend(
        stream["obs"],
        stream["actions"],
        stream["rewards"],
        stream["term"],
        stream["trunc"],
        stream["valid"],
        stream["mask"],
    )
    batch = buf.sample(2000)
    seen = set()
    for i in range(2000):
        t, env = (int(x) for x in batch.obs[i])
        seen.add((t, env))
        assert steps - rows <= t < steps - n and stream["valid"][t, env]
        k, rewards, terminated, next_t = reference_window(stream, t, env, n)
        assert batch.steps[i] == k and batch.terminated[i] == terminated
        np.testing.assert_allclose(batch.rewards[i].numpy(), rewards, rtol=1e-6)
        assert batch.next_obs[i].tolist() == [next_t, env]
        assert batch.actions[i] == stream["actions"][t, env]
        assert batch.next_action_mask[i].tolist() == stream["mask"][next_t, env].tolist()
        assert batch.indices[i] == (t % rows) * num_envs + env
    expected = {(t, e) for t in range(steps - rows, steps - n) for e in range(num_envs)}
    assert seen == {(t, e) for t, e in expected if stream["valid"][t, e]}
    assert buf.num_sampleable() == len(seen)


def test_extend_equals_repeated_add():
    stream = random_stream(12, 2, seed=5)
    fields = [stream[k] for k in ("obs", "actions", "rewards", "term", "trunc", "valid")]
    a = ReplayBuffer(16, 2, OBS, DISCRETE, n_step=2, seed=4)
    b = ReplayBuffer(16, 2, OBS, DISCRETE, n_step=2, seed=4)
    a.extend(*fields)
    for t in range(12):
        b.add(*(f[t] for f in fields))
    sa, sb = a.state_dict(), b.state_dict()
    for name in sa["storage"]:
        np.testing.assert_array_equal(sa["storage"][name], sb["storage"][name])
    assert sa["rows_written"] == sb["rows_written"] == 12
    np.testing.assert_array_equal(a.sample(32).indices, b.sample(32).indices)


def _assert_same_batches(a, b):
    for x, y in zip(a, b, strict=True):
        if isinstance(x, torch.Tensor):
            assert torch.equal(x, y)
        elif isinstance(x, np.ndarray):
            np.testing.assert_array_equal(x, y)
        else:
            assert x is None and y is None


@pytest.mark.parametrize("kind", ["uniform", "proportional", "rank"])
def test_state_dict_round_trip_through_checkpoint(tmp_path, kind):
    def make():
        prios = {
            "uniform": None,
            "proportional": ProportionalPriorities(24),
            "rank": RankBasedPriorities(24, sort_every=2),
        }[kind]
        return ReplayBuffer(24, 2, OBS, DISCRETE, 2, 3, prios, seed=7)

    stream = random_stream(40, 2, seed=3)
    keys = ("obs", "actions", "rewards", "term", "trunc", "valid", "mask")

    def feed(buf, lo, hi):
        buf.extend(*(stream[k][lo:hi] for k in keys))

    original = make()
    feed(original, 0, 20)
    batch = original.sample(8)
    original.update_priorities(batch.indices, torch.arange(8.0))
    save_checkpoint(tmp_path, 20, "dqn", {}, {"replay": original.state_dict()})
    restored = make()
    restored.load_state_dict(load_checkpoint(tmp_path).state["replay"])
    for buf in (original, restored):
        feed(buf, 20, 40)
    assert len(restored) == len(original) and restored.num_sampleable() == original.num_sampleable()
    for _ in range(3):
        a, b = original.sample(16, beta=0.5), restored.sample(16, beta=0.5)
        _assert_same_batches(a, b)
        original.update_priorities(a.indices, np.abs(a.rewards[:, 0].numpy()))
        restored.update_priorities(b.indices, np.abs(b.rewards[:, 0].numpy()))


def test_load_rejects_other_settings():
    state = ReplayBuffer(8, 2, OBS, DISCRETE, n_step=1).state_dict()
    with pytest.raises(ValueError, match="n_step"):
        ReplayBuffer(8, 2, OBS, DISCRETE, n_step=2).load_state_dict(state)


def test_capacity_rounds_up_and_settings_are_checked():
    buf = ReplayBuffer(10, 4, OBS, DISCRETE)
    assert buf.rows == 3 and buf.capacity == 12
    # A factory (class or partial) is built over the rounded-up capacity.
    assert (
        ReplayBuffer(10, 4, OBS, DISCRETE, priorities=RankBasedPriorities).priorities.capacity == 12
    )
    with pytest.raises(ValueError, match="capacity=12"):
        ReplayBuffer(10, 4, OBS, DISCRETE, priorities=ProportionalPriorities(10))
    with pytest.raises(ValueError, match="n_step=3"):
        ReplayBuffer(6, 2, OBS, DISCRETE, n_step=3)


def test_uniform_weights_are_ones_and_priority_updates_are_no_ops():
    buf = episode_buffer(n_step=1)
    batch = buf.sample(16)
    assert torch.equal(batch.weights, torch.ones(16))
    buf.update_priorities(batch.indices, np.ones(16))
