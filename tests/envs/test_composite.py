"""Dict and Tuple observations packed into byte records (`shoal.envs.composite`), their
storage and their per-key normalization."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from shoal.core.errors import ShoalError, UnsupportedSpaceError
from shoal.data.replay import ReplayBuffer
from shoal.data.rollout import RolloutStorage
from shoal.envs.composite import ALIGN, PackedObs
from shoal.envs.normalize import FieldStats, RunningMeanStd, load_obs_stats, normalize
from shoal.envs.spaces import space_from_json, space_to_json

NESTED = gym.spaces.Dict(
    {
        "image": gym.spaces.Box(0, 255, (1, 36, 36), np.uint8),
        "goal": gym.spaces.Discrete(5),
        "inner": gym.spaces.Dict(
            {
                "vec": gym.spaces.Box(-1.0, 1.0, (3,), np.float64),
                "pair": gym.spaces.Tuple(
                    (gym.spaces.MultiDiscrete([3, 4]), gym.spaces.MultiBinary(2))
                ),
            }
        ),
    }
)


def batch_of(space, n, seed=0):
    space.seed(seed)
    samples = [space.sample() for _ in range(n)]

    def stack(items, template):
        if isinstance(template, dict):
            return {k: stack([i[k] for i in items], template[k]) for k in template}
        if isinstance(template, tuple):
            return tuple(stack([i[j] for i in items], t) for j, t in enumerate(template))
        return np.stack([np.asarray(i) for i in items])

    return stack(samples, samples[0]), samples


def test_leaves_layout_and_dtypes():
    space = PackedObs(NESTED)
    names = [leaf.name for leaf in space.leaves]
    assert names == ["goal", "image", "inner.pair.0", "inner.pair.1", "inner.vec"]
    dtypes = {leaf.name: leaf.dtype for leaf in space.leaves}
    assert dtypes == {
        "goal": np.int64,
        "image": np.uint8,  # images stay one byte a pixel
        "inner.pair.0": np.int64,
        "inner.pair.1": np.uint8,
        "inner.vec": np.float32,
    }
    assert all(leaf.offset % ALIGN == 0 for leaf in space.leaves)
    assert space.record_bytes % ALIGN == 0
    assert space.shape == (space.record_bytes,) and space.dtype == np.uint8
    # No bigger than the parts, each rounded up to 8 bytes.
    assert space.record_bytes == 8 + 1296 + 16 + 8 + 16


def test_pack_unpack_round_trip_keeps_every_value():
    space = PackedObs(NESTED)
    batch, _ = batch_of(NESTED, 6)
    records = space.pack(batch)
    assert records.shape == (6, space.record_bytes) and records.dtype == np.uint8
    back = space.unpack(records)
    np.testing.assert_array_equal(back["image"], batch["image"])
    np.testing.assert_array_equal(back["goal"], batch["goal"])
    np.testing.assert_array_equal(back["inner"]["pair"][0], batch["inner"]["pair"][0])
    np.testing.assert_array_equal(back["inner"]["pair"][1], batch["inner"]["pair"][1])
    np.testing.assert_array_equal(back["inner"]["vec"], batch["inner"]["vec"].astype(np.float32))
    # Tensors read the same values, as zero-copy views of the records.
    parts = space.unpack_tensor(torch.from_numpy(records))
    assert parts["image"].dtype == torch.uint8 and parts["goal"].dtype == torch.int64
    np.testing.assert_array_equal(parts["inner"]["vec"].numpy(), back["inner"]["vec"])


def test_pack_one_and_single_detection():
    space = PackedObs(NESTED)
    _, samples = batch_of(NESTED, 1)
    one = samples[0]
    assert space.is_single(one)
    record = space.pack_one(one)
    assert record.shape == (space.record_bytes,)
    assert space.unpack(record[None])["goal"][0] == one["goal"]


def test_tuple_space_and_json_round_trip():
    space = PackedObs(gym.spaces.Tuple((gym.spaces.Box(0, 1, (2,)), gym.spaces.Discrete(3))))
    assert [leaf.name for leaf in space.leaves] == ["0", "1"]
    again = space_from_json(space_to_json(space))
    assert isinstance(again, PackedObs) and again == space
    assert [leaf.offset for leaf in again.leaves] == [leaf.offset for leaf in space.leaves]


def test_unsupported_part_names_its_path():
    space = gym.spaces.Dict({"ok": gym.spaces.Discrete(2), "text": gym.spaces.Text(5)})
    with pytest.raises(UnsupportedSpaceError, match="'text'.*Box, Discrete, MultiDiscrete"):
        PackedObs(space)


def test_wrong_part_shape_is_a_clear_error():
    space = PackedObs(gym.spaces.Dict({"a": gym.spaces.Box(0, 1, (2,))}))
    with pytest.raises(ShoalError, match="'a' should have shape"):
        space.pack({"a": np.zeros((4, 3), np.float32)})
    with pytest.raises(ShoalError, match="no part 'a'"):
        space.pack({"b": np.zeros((4, 2), np.float32)})


@pytest.mark.parametrize("storage", ["rollout", "replay"])
def test_storage_keeps_each_part_and_dtype(storage):
    space = PackedObs(NESTED)
    batch, _ = batch_of(NESTED, 3, seed=1)
    records = space.pack(batch)
    actions = gym.spaces.Discrete(2)
    if storage == "rollout":
        store = RolloutStorage(2, 3, space, actions)
        assert store.obs.dtype == torch.uint8 and store.obs.shape == (2, 3, space.record_bytes)
        store.write_obs(1, records)
        stored = store.obs[1].numpy()
    else:
        store = ReplayBuffer(10, 3, space, actions)
        assert store.obs.dtype == np.uint8
        false = np.zeros(3, bool)
        store.add(records, np.zeros(3, np.int64), np.zeros(3, np.float32), false, false, ~false)
        stored = store.obs[0]
    back = space.unpack(np.asarray(stored))
    np.testing.assert_array_equal(back["image"], batch["image"])
    assert back["image"].dtype == np.uint8
    np.testing.assert_array_equal(back["goal"], batch["goal"])


def test_field_stats_normalize_each_float_part_only():
    space = PackedObs(
        gym.spaces.Dict(
            {
                "a": gym.spaces.Box(-np.inf, np.inf, (2,), np.float32),
                "b": gym.spaces.Box(-np.inf, np.inf, (1,), np.float32),
                "goal": gym.spaces.Discrete(4),
            }
        )
    )
    rng = np.random.default_rng(0)
    batch = {
        "a": rng.normal(5.0, 2.0, (500, 2)).astype(np.float32),
        "b": rng.normal(-100.0, 10.0, (500, 1)).astype(np.float32),
        "goal": rng.integers(0, 4, 500),
    }
    records = space.pack(batch)
    stats = FieldStats.of(space)
    stats.update(records)
    out = space.unpack(normalize(records, stats, clip=10.0))
    for key in ("a", "b"):  # each part standardized with its own statistics
        reference = RunningMeanStd(batch[key].shape[1:])
        reference.update(batch[key])
        np.testing.assert_allclose(out[key], normalize(batch[key], reference, 10.0), atol=1e-5)
        assert abs(out[key].mean()) < 1e-3
    np.testing.assert_array_equal(out["goal"], batch["goal"])  # discrete part untouched
    np.testing.assert_array_equal(space.unpack(records)["a"], batch["a"])  # input unchanged
    loaded = load_obs_stats(stats.state_dict())  # what a deployed policy reads
    np.testing.assert_array_equal(normalize(records, loaded, 10.0), normalize(records, stats, 10.0))
