"""`shoal.envs.shapes`: a space narrowed to the kind a component reads, or a TypeError that
names it."""

import gymnasium as gym
import numpy as np
import pytest

from shoal.envs.shapes import as_box, as_discrete, shape_of


def test_shape_of_returns_the_shape_of_a_space_that_has_one():
    assert shape_of(gym.spaces.Box(-1.0, 1.0, (3, 2))) == (3, 2)
    assert shape_of(gym.spaces.Discrete(4)) == ()
    assert shape_of(gym.spaces.MultiDiscrete([2, 3])) == (2,)


def test_shape_of_refuses_a_space_without_a_fixed_shape():
    with pytest.raises(TypeError, match="Text space has no fixed shape"):
        shape_of(gym.spaces.Text(5))


def test_as_box_and_as_discrete_pass_their_kind_and_name_any_other():
    box = gym.spaces.Box(np.zeros(2, np.float32), np.ones(2, np.float32))
    assert as_box(box) is box
    discrete = gym.spaces.Discrete(3)
    assert as_discrete(discrete) is discrete
    with pytest.raises(TypeError, match=r"expected a Box space, got Discrete\(3\)"):
        as_box(discrete)
    with pytest.raises(TypeError, match="expected a Discrete space, got Box"):
        as_discrete(box)
