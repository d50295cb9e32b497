"""The NumPy path (`shoal.fast`) against autograd: for every objective and every model it
supports the same gradients, the same actions, and PPO and A2C learners that end an update
with the same weights on both backends."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from shoal.algos.cores.rollout_batch import RolloutBatch
from shoal.algos.policy_gradient.a2c import A2CConfig, A2CLearner
from shoal.algos.policy_gradient.ppo import PPOConfig, PPOLearner
from shoal.config import ModelConfig, OptimConfig, replace
from shoal.core.errors import ConfigError
from shoal.fast import NumpyActor, NumpyLearner, backend, unsupported
from shoal.fast.mlp import NumpyActorCritic
from shoal.losses.objectives import PolicyOutputs, a2c_objective, ppo_objective
from shoal.nn import ActorCritic

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

OBJECTIVES = {
    "ppo": ppo_objective(0.2, 0.5, 0.01),
    "ppo clipped value, kl penalty, no entropy": ppo_objective(
        0.1, 1.0, 0.0, value_clip=0.2, kl_coeff=0.3
    ),
    "a2c": a2c_objective(0.5, 0.01),
    "a2c, no value weight": a2c_objective(0.0, 0.01, normalize_advantages=True),
}


def make_batch(obs_space, action_space, n=48, seed=0) -> RolloutBatch:
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
    values = torch.randn(n, generator=g)
    advantages, returns = torch.randn(n, generator=g), torch.randn(n, generator=g)
    return RolloutBatch(obs, actions, old_log_prob, values, advantages, returns)


def as_arrays(batch: RolloutBatch) -> RolloutBatch:
    return batch.map(lambda x: x.numpy())


@pytest.mark.parametrize("objective_name", list(OBJECTIVES))
@pytest.mark.parametrize("name", list(MODELS))
def test_gradients_equal_autograds_for_every_objective_and_model(name, objective_name):
    obs_space, action_space, config = MODELS[name]
    objective = OBJECTIVES[objective_name]
    torch.manual_seed(0)
    model = ActorCritic(obs_space, action_space, config)
    assert unsupported(model) is None
    batch = make_batch(obs_space, action_space)

    dist, values = model(batch.obs)
    out = PolicyOutputs(dist.log_prob(batch.actions), dist.entropy(), values)
    losses, _ = objective.losses(out, objective.targets(batch))
    losses["total"].backward()
    # A parameter the objective does not reach (the value head at weight 0) gets zeros.
    expected = {
        k: torch.zeros_like(p) if p.grad is None else p.grad.clone()
        for k, p in model.named_parameters()
    }
    model.zero_grad(set_to_none=True)

    net = NumpyActorCritic(model)
    arrays = as_arrays(batch)
    array_out, saved = net.outputs(arrays.obs, arrays.actions)
    for field, want, got in zip(PolicyOutputs._fields, out, array_out, strict=True):
        torch.testing.assert_close(torch.from_numpy(got), want.detach(), msg=field)
    targets = objective.targets(arrays)
    array_losses, _ = objective.losses(array_out, targets)
    for key, value in losses.items():
        assert float(array_losses[key]) == pytest.approx(value.item(), rel=1e-5, abs=1e-6)
    net.backward(saved, objective.gradients(array_out, targets))
    for key, param in model.named_parameters():
        assert param.grad is not None and param.grad.shape == param.shape, key
        torch.testing.assert_close(param.grad, expected[key], rtol=1e-4, atol=1e-7, msg=key)


def test_unsupported_models_say_why_and_keep_autograd():
    assert "activation" in unsupported(ActorCritic(OBS, DISCRETE, ModelConfig(activation="silu")))
    image = gym.spaces.Box(0, 255, (4, 84, 84), dtype="uint8")
    assert "encoder" in unsupported(ActorCritic(image, DISCRETE, ModelConfig(encoder="nature")))
    with pytest.raises(ValueError, match="no NumPy path"):
        NumpyActorCritic(ActorCritic(OBS, DISCRETE, ModelConfig(activation="elu")))
    elu = ActorCritic(OBS, DISCRETE, ModelConfig(activation="elu"))
    assert not backend.uses_numpy(elu, "auto")
    with pytest.raises(ConfigError, match="model.backend = 'numpy'.*activation"):
        backend.uses_numpy(elu, "numpy")
    tanh = ActorCritic(OBS, DISCRETE, ModelConfig())
    assert backend.uses_numpy(tanh, "auto") and not backend.uses_numpy(tanh, "torch")
    assert not backend.uses_numpy(tanh, "auto", compiled=True)
    with pytest.raises(ConfigError, match="run.device is cuda"):
        backend.uses_numpy(tanh, "numpy", device="cuda")


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("name", list(MODELS))
def test_act_equals_the_models_act_with_the_same_draws(name, deterministic):
    obs_space, action_space, config = MODELS[name]
    torch.manual_seed(0)
    model = ActorCritic(obs_space, action_space, config)
    obs = make_batch(obs_space, action_space, n=64).obs
    actor = NumpyActor(model)
    torch.manual_seed(1)
    with torch.inference_mode():
        expected = model.act(obs, deterministic)
        expected_values = model.value(obs)
    # A tensor observation, and the sampler's NumPy row: the same results as NumPy arrays.
    for observation in (obs, obs.numpy()):
        torch.manual_seed(1)
        out = actor.act(observation, deterministic)
        assert all(isinstance(x, np.ndarray) for x in out)
        assert out.actions.dtype == expected.actions.numpy().dtype
        assert out.actions.shape == tuple(expected.actions.shape)
        actions, log_probs, values = (torch.from_numpy(x) for x in out)
        torch.testing.assert_close(actions, expected.actions)
        torch.testing.assert_close(log_probs, expected.log_probs, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(values, expected.values)
    torch.testing.assert_close(torch.from_numpy(actor.value(obs.numpy())), expected_values)


def test_views_follow_loaded_weights_and_new_parameter_memory():
    torch.manual_seed(0)
    model = ActorCritic(OBS, DISCRETE, ModelConfig())
    other = ActorCritic(OBS, DISCRETE, ModelConfig())
    net = NumpyActorCritic(model, flat_parameters=True)
    obs = torch.randn(8, 5)
    model.load_state_dict(other.state_dict())  # copies into the flat buffer
    torch.testing.assert_close(torch.from_numpy(net.value(obs)), other.value(obs).detach())
    for param in model.parameters():  # new memory: the views are rebuilt
        param.data = param.data.clone() * 2.0
    torch.testing.assert_close(torch.from_numpy(net.value(obs)), model.value(obs).detach())


def test_flat_parameters_keep_the_model_and_its_state_dict():
    torch.manual_seed(0)
    model = ActorCritic(OBS, BOX, ModelConfig())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    net = NumpyLearner(model).net
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, before[key])
    pieces = [p.data_ptr() for p in model.parameters()]
    start = net.flat_param.data_ptr()
    assert pieces[0] == start and sorted(pieces) == pieces  # one buffer, in order


def _learners(cls, config, obs_space, action_space):
    """The same learner on both backends, from the same initial weights."""
    made = {}
    for name in ("torch", "numpy"):
        torch.manual_seed(0)
        model = replace(config.model, backend=name)
        made[name] = cls(replace(config, model=model), obs_space, action_space)
    assert isinstance(made["numpy"].step, backend.NumpyStep)
    assert isinstance(made["torch"].step, backend.TorchStep)
    return made


@pytest.mark.parametrize("action_space", [DISCRETE, BOX], ids=["discrete", "box"])
def test_ppo_takes_the_same_steps_on_both_backends(action_space):
    config = PPOConfig(
        num_steps=16, num_epochs=3, minibatch_size=32, value_clip=0.2, ent_coef=0.01, kl_coeff=0.1
    )
    learners = _learners(PPOLearner, config, OBS, action_space)
    batch = make_batch(OBS, action_space, n=96, seed=3)
    metrics = {}
    for name, learner in learners.items():
        torch.manual_seed(5)  # the minibatch shuffles
        metrics[name] = learner.update(batch, lr=3e-3, clip_eps=0.2, kl_coeff=0.1)
    _assert_same_weights(learners)
    assert metrics["torch"].keys() == metrics["numpy"].keys()
    for key, value in metrics["torch"].items():
        assert metrics["numpy"][key] == pytest.approx(value, rel=1e-3, abs=1e-5), key


@pytest.mark.parametrize("optimizer", ["rmsprop", "adam"])
def test_a2c_takes_the_same_steps_on_both_backends(optimizer):
    config = A2CConfig(
        optimizer=optimizer, ent_coef=0.01, optim=OptimConfig(lr=7e-4, max_grad_norm=0.5)
    )
    learners = _learners(A2CLearner, config, OBS, DISCRETE)
    for step in range(3):
        batch = make_batch(OBS, DISCRETE, n=40, seed=step)
        metrics = {name: learner.update(batch, lr=7e-4) for name, learner in learners.items()}
    _assert_same_weights(learners)
    for key, value in metrics["torch"].items():
        assert metrics["numpy"][key] == pytest.approx(value, rel=1e-3, abs=1e-5), key


def _assert_same_weights(learners):
    torch_model, numpy_model = learners["torch"].model, learners["numpy"].model
    numpy_weights = numpy_model.state_dict()
    for key, value in torch_model.state_dict().items():
        torch.testing.assert_close(numpy_weights[key], value, rtol=1e-4, atol=1e-6, msg=key)
