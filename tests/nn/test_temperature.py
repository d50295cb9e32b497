"""Softmax temperature of categorical policies and its annealing schedule (Lamb et al.)."""

import copy

import gymnasium as gym
import pytest
import torch
from torch.testing import assert_close

from shoal.config import ModelConfig
from shoal.core.errors import ConfigError
from shoal.nn import ActorCritic, CategoricalHead
from shoal.nn.heads import set_temperature
from shoal.optim.schedules import annealed_temperature

OBS = gym.spaces.Box(-1.0, 1.0, (3,))
DISCRETE = gym.spaces.Discrete(4)


# --- schedule -----------------------------------------------------------------------------------


def test_constant_without_temperature_min():
    config = ModelConfig(temperature=1.5)
    assert annealed_temperature(config, 0, 0) == 1.5
    assert annealed_temperature(config, 10**9, 10**6) == 1.5


@pytest.mark.parametrize(
    ("env_steps", "want"), [(0, 2.0), (250, 1.625), (500, 1.25), (1000, 0.5), (5000, 0.5)]
)
def test_anneals_linearly_over_steps_then_holds(env_steps, want):
    config = ModelConfig(temperature=2.0, temperature_min=0.5, temperature_anneal=1000)
    # Episodes do not count when the unit is steps.
    assert annealed_temperature(config, env_steps, episodes=123) == pytest.approx(want)


@pytest.mark.parametrize(("episodes", "want"), [(0, 1.0), (1, 0.82), (2, 0.64), (5, 0.1), (9, 0.1)])
def test_anneals_linearly_over_episodes_then_holds(episodes, want):
    config = ModelConfig(
        temperature=1.0, temperature_min=0.1, temperature_anneal=5, temperature_unit="episodes"
    )
    assert annealed_temperature(config, env_steps=10**6, episodes=episodes) == pytest.approx(want)


@pytest.mark.parametrize(
    ("kwargs", "field", "allowed"),
    [
        ({"temperature_min": 0.0}, "ModelConfig.temperature_min", "> 0"),
        ({"temperature_min": 2.0}, "ModelConfig.temperature_min", "<= temperature = 1.0"),
        ({"temperature_anneal": 0}, "ModelConfig.temperature_anneal", "> 0"),
        ({"temperature_unit": "iterations"}, "ModelConfig.temperature_unit", "'episodes'"),
    ],
)
def test_invalid_schedule_names_the_field(kwargs, field, allowed):
    with pytest.raises(ConfigError, match=field) as error:
        ModelConfig(**kwargs)
    assert allowed in str(error.value)


# --- head -----------------------------------------------------------------------------------


def test_probabilities_are_softmax_of_logits_over_temperature():
    torch.manual_seed(0)
    head = CategoricalHead(5, 4)
    features = torch.randn(6, 5)
    logits = head.logits(features)
    assert_close(head(features).logits.exp(), torch.softmax(logits, -1))
    set_temperature(head, 2.5)
    assert_close(head(features).logits.exp(), torch.softmax(logits / 2.5, -1))
    # The constructor's temperature is the buffer's initial value.
    half = CategoricalHead(5, 4, 0.5)
    assert half.temperature.item() == 0.5
    assert_close(half(features).logits.exp(), torch.softmax(half.logits(features) / 0.5, -1))


def test_temperature_travels_with_the_state_dict():
    source = ActorCritic(OBS, DISCRETE, ModelConfig(hidden=(8,)))
    target = ActorCritic(OBS, DISCRETE, ModelConfig(hidden=(8,)))
    assert set_temperature(source, 0.25)
    state = source.state_dict()
    assert state["policy_head.temperature"].item() == 0.25
    target.load_state_dict(state)
    assert target.policy_head.temperature.item() == 0.25
    obs = torch.randn(5, 3)
    assert_close(target.distribution(obs).logits.exp(), source.distribution(obs).logits.exp())
    # Back to 1 through a load: the head skips the division again and agrees with the source.
    set_temperature(source, 1.0)
    target.load_state_dict(source.state_dict())
    assert_close(target.distribution(obs).logits.exp(), source.distribution(obs).logits.exp())
    assert copy.deepcopy(target).policy_head.temperature.item() == 1.0


def test_weights_without_the_buffer_keep_the_configured_temperature():
    """State dicts saved before the temperature was a buffer still load."""
    model = ActorCritic(OBS, DISCRETE, ModelConfig(hidden=(8,), temperature=3.0))
    state = model.state_dict()
    del state["policy_head.temperature"]
    model.load_state_dict(state)
    assert model.policy_head.temperature.item() == 3.0


def test_set_temperature_is_a_no_op_without_categorical_head():
    model = ActorCritic(OBS, gym.spaces.Box(-1.0, 1.0, (2,)), ModelConfig(hidden=(8,)))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert not set_temperature(model, 0.5)
    after = model.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_set_temperature_refuses_non_positive():
    with pytest.raises(ValueError, match="> 0"):
        set_temperature(CategoricalHead(2, 2), 0.0)
