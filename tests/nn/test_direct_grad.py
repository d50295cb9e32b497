"""`DirectGradActorCritic`: the hand-derived gradient equals autograd's for every model it
supports, and PPO / A2C updates through it equal the autograd updates."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from shoal.config import ModelConfig
from shoal.losses import entropy_loss, ppo_clip_loss, value_loss
from shoal.losses.gradients import entropy_loss_grad, ppo_clip_loss_grad, value_loss_grad
from shoal.nn import ActorCritic
from shoal.nn.direct_grad import DirectGradActorCritic

OBS = gym.spaces.Box(-1.0, 1.0, (5,))
DISCRETE = gym.spaces.Discrete(3)
BOX = gym.spaces.Box(-1.0, 1.0, (2,))

MODELS = {
    "separate tanh categorical": (OBS, DISCRETE, ModelConfig()),
    "separate relu categorical, 3 layers, temperature": (
        OBS,
        DISCRETE,
        ModelConfig(hidden=(16, 8, 4), activation="relu", temperature=0.5),
    ),
    "shared tanh categorical": (OBS, DISCRETE, ModelConfig(shared_trunk=True, hidden=(32,))),
    "separate tanh gaussian": (OBS, BOX, ModelConfig(init_log_std=-0.5)),
    "shared relu gaussian": (OBS, BOX, ModelConfig(shared_trunk=True, activation="relu")),
    "discrete observations (one-hot)": (gym.spaces.Discrete(6), DISCRETE, ModelConfig()),
}


def batch(obs_space, action_space, n=48, seed=0):
    g = torch.Generator().manual_seed(seed)
    if isinstance(obs_space, gym.spaces.Discrete):
        obs = torch.randint(0, obs_space.n, (n,), generator=g)
    else:
        obs = torch.randn(n, *obs_space.shape, generator=g)
    if isinstance(action_space, gym.spaces.Discrete):
        actions = torch.randint(0, action_space.n, (n,), generator=g)
    else:
        actions = torch.randn(n, *action_space.shape, generator=g)
    old_log_prob = -1.0 + 0.2 * torch.randn(n, generator=g)
    return obs, actions, old_log_prob, torch.randn(n, generator=g), torch.randn(n, generator=g)


def ppo_loss(log_prob, entropy, values, old_log_prob, adv, returns):
    policy, _ = ppo_clip_loss(log_prob, old_log_prob, adv, 0.2)
    return policy + 0.5 * value_loss(values, returns) + 0.01 * entropy_loss(entropy)


@pytest.mark.parametrize("name", list(MODELS))
def test_direct_gradient_equals_autograd(name):
    obs_space, action_space, config = MODELS[name]
    torch.manual_seed(0)
    model = ActorCritic(obs_space, action_space, config)
    assert DirectGradActorCritic.supports(model)
    obs, actions, old, adv, returns = batch(obs_space, action_space)

    dist, values = model(obs)
    log_prob, entropy = dist.log_prob(actions), dist.entropy()
    ppo_loss(log_prob, entropy, values, old, adv, returns).backward()
    expected = {k: p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)

    direct = DirectGradActorCritic(model)
    out = direct.outputs(obs, actions)
    torch.testing.assert_close(out.log_prob, log_prob.detach())
    torch.testing.assert_close(out.entropy, entropy.detach())
    torch.testing.assert_close(out.values, values.detach())
    direct.backward(
        out,
        ppo_clip_loss_grad(out.log_prob, old, adv, 0.2),
        0.01 * entropy_loss_grad(out.entropy),
        0.5 * value_loss_grad(out.values, returns),
    )
    for key, param in model.named_parameters():
        assert param.grad is not None and param.grad.shape == param.shape, key
        torch.testing.assert_close(param.grad, expected[key], rtol=1e-4, atol=1e-7, msg=key)


def test_unsupported_models_keep_autograd():
    assert not DirectGradActorCritic.supports(
        ActorCritic(OBS, DISCRETE, ModelConfig(activation="silu"))
    )
    image = gym.spaces.Box(0, 255, (4, 84, 84), dtype="uint8")
    assert not DirectGradActorCritic.supports(
        ActorCritic(image, DISCRETE, ModelConfig(encoder="nature"))
    )
    with pytest.raises(ValueError, match="no hand-derived gradient"):
        DirectGradActorCritic(ActorCritic(OBS, DISCRETE, ModelConfig(activation="elu")))


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("name", list(MODELS))
def test_act_equals_the_models_act_with_the_same_draws(name, deterministic):
    obs_space, action_space, config = MODELS[name]
    torch.manual_seed(0)
    model = ActorCritic(obs_space, action_space, config)
    obs = batch(obs_space, action_space, n=64)[0]
    direct = DirectGradActorCritic(model)
    torch.manual_seed(1)
    with torch.inference_mode():
        expected = model.act(obs, deterministic)
        expected_values = model.value(obs)
    # A tensor observation, and the sampler's NumPy row: the same results as NumPy arrays.
    for observation in (obs, obs.numpy()):
        torch.manual_seed(1)
        out = direct.act_arrays(observation, deterministic)
        assert all(isinstance(x, np.ndarray) for x in out)
        assert out.actions.dtype == expected.actions.numpy().dtype
        assert out.actions.shape == tuple(expected.actions.shape)
        actions, log_probs, values = (torch.from_numpy(x) for x in out)
        torch.testing.assert_close(actions, expected.actions)
        torch.testing.assert_close(log_probs, expected.log_probs, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(values, expected.values)
    torch.testing.assert_close(direct.value(obs), expected_values)


def test_views_follow_loaded_weights_and_new_parameter_memory():
    torch.manual_seed(0)
    model = ActorCritic(OBS, DISCRETE, ModelConfig())
    other = ActorCritic(OBS, DISCRETE, ModelConfig())
    direct = DirectGradActorCritic(model, flat_parameters=True)
    obs = torch.randn(8, 5)
    model.load_state_dict(other.state_dict())  # copies into the flat buffer
    torch.testing.assert_close(direct.value(obs), other.value(obs).detach())
    for param in model.parameters():  # new memory: the views are rebuilt
        param.data = param.data.clone() * 2.0
    torch.testing.assert_close(direct.value(obs), model.value(obs).detach())


def test_flat_parameters_keep_the_model_and_its_state_dict():
    torch.manual_seed(0)
    model = ActorCritic(OBS, BOX, ModelConfig())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    direct = DirectGradActorCritic(model, flat_parameters=True)
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, before[key])
    pieces = [p.data_ptr() for p in model.parameters()]
    start = direct.flat_param.data_ptr()
    assert pieces[0] == start and sorted(pieces) == pieces  # one buffer, in order
