"""The combined encoder of Dict and Tuple observations (`shoal.nn.composite`)."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from shoal.config import ModelConfig
from shoal.core.errors import ConfigError
from shoal.envs.composite import PackedObs
from shoal.nn.actor_critic import ActorCritic
from shoal.nn.cnn import ImageEncoder
from shoal.nn.composite import (
    EMBEDDING_DIM,
    ONE_HOT_MAX,
    Categories,
    CompositeEncoder,
    Flatten,
    KeyMLP,
)

NESTED = gym.spaces.Dict(
    {
        "image": gym.spaces.Box(0, 255, (1, 36, 36), np.uint8),
        "goal": gym.spaces.Discrete(5),
        "big": gym.spaces.Discrete(ONE_HOT_MAX + 36),
        "inner": gym.spaces.Tuple(
            (
                gym.spaces.Box(-1.0, 1.0, (3,), np.float32),
                gym.spaces.MultiDiscrete([3, 4]),
                gym.spaces.MultiBinary(2),
            )
        ),
    }
)


def records_of(space, n=8, seed=0):
    NESTED.seed(seed)
    samples = [NESTED.sample() for _ in range(n)]
    batch = {
        "image": np.stack([s["image"] for s in samples]),
        "goal": np.array([s["goal"] for s in samples]),
        "big": np.array([s["big"] for s in samples]),
        "inner": tuple(np.stack([s["inner"][i] for s in samples]) for i in range(3)),
    }
    return torch.from_numpy(space.pack(batch)), batch


def test_each_part_gets_its_encoder_and_shapes_add_up():
    space = PackedObs(NESTED)
    encoder = CompositeEncoder(space, ModelConfig(key_hidden=(16,)))
    kinds = {leaf.name: type(enc) for leaf, enc in zip(space.leaves, encoder.encoders, strict=True)}
    assert kinds == {
        "big": Categories,  # embedded (more than ONE_HOT_MAX values)
        "goal": Categories,  # one-hot
        "image": ImageEncoder,  # the Nature CNN when model.encoder is mlp
        "inner.0": KeyMLP,  # a float vector with its own MLP (key_hidden)
        "inner.1": Categories,
        "inner.2": Flatten,
    }
    assert encoder.encoders[0].out_dim == EMBEDDING_DIM and encoder.encoders[1].out_dim == 5
    assert encoder.out_dim == EMBEDDING_DIM + 5 + 512 + 16 + (3 + 4) + 2
    records, _ = records_of(space)
    features = encoder(records)
    assert features.shape == (8, encoder.out_dim) and features.dtype == torch.float32


def test_one_hot_parts_hold_the_values():
    space = PackedObs(NESTED)
    encoder = CompositeEncoder(space)
    records, batch = records_of(space)
    goal = encoder.encoders[1](space.leaf_tensor(records, space.leaves[1]))
    np.testing.assert_array_equal(goal.argmax(-1).numpy(), batch["goal"])
    multi = encoder.encoders[4](space.leaf_tensor(records, space.leaves[4]))
    np.testing.assert_array_equal(multi[:, :3].argmax(-1).numpy(), batch["inner"][1][:, 0])
    np.testing.assert_array_equal(multi[:, 3:].argmax(-1).numpy(), batch["inner"][1][:, 1])


def test_gradients_reach_every_part():
    space = PackedObs(NESTED)
    encoder = CompositeEncoder(space, ModelConfig(key_hidden=(16,)))
    records, _ = records_of(space)
    encoder(records).square().sum().backward()
    for name, param in encoder.named_parameters():
        assert param.grad is not None and param.grad.abs().sum() > 0, name


def test_actor_critic_on_a_nested_space_trains_every_part():
    space = PackedObs(NESTED)
    model = ActorCritic(space, gym.spaces.Discrete(3), ModelConfig(hidden=(32,)))
    records, _ = records_of(space)
    dist, values = model(records)
    (dist.log_prob(torch.zeros(8, dtype=torch.long)).sum() + values.sum()).backward()
    image = model.encoding.composite.encoders[2]
    assert all(p.grad is not None for p in image.parameters())


def test_numpy_features_equal_forward():
    space = PackedObs(
        gym.spaces.Dict(
            {
                "a": gym.spaces.Box(-1, 1, (2,), np.float32),
                "b": gym.spaces.Box(-1, 1, (3,), np.float32),
            }
        )
    )
    encoder = CompositeEncoder(space)
    records = space.pack({"a": np.random.rand(4, 2), "b": np.random.rand(4, 3)})
    np.testing.assert_array_equal(
        encoder.numpy_features(records), encoder(torch.from_numpy(records)).numpy()
    )
    mixed = PackedObs(
        gym.spaces.Dict({"a": gym.spaces.Box(-1, 1, (2,)), "g": gym.spaces.Discrete(3)})
    )
    encoder = CompositeEncoder(mixed)
    records = mixed.pack({"a": np.random.rand(4, 2), "g": np.array([0, 2, 1, 2])})
    np.testing.assert_array_equal(
        encoder.numpy_features(records), encoder(torch.from_numpy(records)).numpy()
    )


def test_small_images_are_pixels_unless_a_cnn_is_asked_for():
    space = PackedObs(gym.spaces.Dict({"image": gym.spaces.Box(0, 255, (7, 7, 3), np.uint8)}))
    encoder = CompositeEncoder(space)  # MiniGrid-sized: too small for the Nature CNN
    assert isinstance(encoder.encoders[0], Flatten) and encoder.out_dim == 147
    records = space.pack({"image": np.full((2, 7, 7, 3), 255, np.uint8)})
    np.testing.assert_array_equal(encoder(torch.from_numpy(records)).numpy(), 1.0)
    np.testing.assert_array_equal(encoder.numpy_features(records), 1.0)
    with pytest.raises(ConfigError, match="part 'image'.*at least 36x36"):
        CompositeEncoder(space, ModelConfig(encoder="nature"))
    with pytest.raises(ConfigError, match="part 'image'.*cannot encode it"):
        CompositeEncoder(space, ModelConfig(encoder="tests.custom_nets:TinyEncoder"))


def test_float_input_is_refused():
    space = PackedObs(gym.spaces.Dict({"a": gym.spaces.Box(-1, 1, (2,))}))
    with pytest.raises(Exception, match="packed uint8 records"):
        CompositeEncoder(space)(torch.zeros(3, space.record_bytes))
