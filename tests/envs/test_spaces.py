"""Spaces as JSON in checkpoints: every kind round-trips, and bad descriptions are named."""

import json

import gymnasium as gym
import numpy as np
import pytest

from shoal.core.errors import CheckpointError
from shoal.envs.spaces import space_from_json, space_to_json

SPACES = [
    gym.spaces.Box(-np.inf, np.inf, (4,), np.float32),  # CartPole-like, unbounded
    gym.spaces.Box(np.array([-1.0, 0.0]), np.array([1.0, 5.0]), dtype=np.float64),
    gym.spaces.Box(0, 255, (84, 84, 4), np.uint8),
    gym.spaces.Discrete(5, start=-2),
    gym.spaces.MultiDiscrete([3, 4, 2]),
    gym.spaces.MultiBinary(6),
    gym.spaces.Tuple((gym.spaces.Discrete(2), gym.spaces.Box(-1, 1, (2,), np.float32))),
    gym.spaces.Dict(
        {
            "pos": gym.spaces.Box(-1, 1, (3,), np.float32),
            "goal": gym.spaces.Discrete(4),
            "inner": gym.spaces.Dict({"flag": gym.spaces.MultiBinary(2)}),
        }
    ),
]


@pytest.mark.parametrize("space", SPACES, ids=lambda s: type(s).__name__)
def test_every_space_round_trips_through_json(space):
    data = json.loads(json.dumps(space_to_json(space)))  # what meta.json holds
    assert space_from_json(data) == space


def test_uniform_box_bounds_are_stored_once():
    data = space_to_json(gym.spaces.Box(0, 255, (84, 84, 4), np.uint8))
    assert data["low"] == 0.0 and data["high"] == 255.0


def test_a_space_it_cannot_describe_is_a_type_error():
    with pytest.raises(TypeError, match="Text"):
        space_to_json(gym.spaces.Text(5))


@pytest.mark.parametrize(
    "data, message",
    [
        ({"type": "Graph"}, "unknown space type 'Graph'"),
        ({"type": "Discrete"}, "unreadable space description"),
        ({"type": "Box", "shape": [2], "dtype": "float32", "low": [0, 0, 0], "high": 1},
         "unreadable space description"),
    ],
)  # fmt: skip
def test_a_bad_description_is_a_checkpoint_error(data, message):
    with pytest.raises(CheckpointError, match=message):
        space_from_json(data)
