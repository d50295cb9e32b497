"""Image encoders: the papers' layer sizes, init, scaling, and PPO / A2C / DQN built on them."""

import gymnasium as gym
import numpy as np
import pytest
import torch
from image_env import FakeImageEnv
from torch import nn

import shoal
from shoal.algos.policy_gradient import a2c, ppo
from shoal.algos.value import dqn
from shoal.config import ModelConfig
from shoal.core.errors import ConfigError, UnsupportedSpaceError
from shoal.nn import ActorCritic, RecurrentActorCritic
from shoal.nn.cnn import build_encoder, image_encoder
from shoal.nn.q_network import QNetwork

ENCODERS = ("nature", "batchnorm-cnn2", "batchnorm-cnn3-lstm", "impala")


def image_space(*shape):
    return gym.spaces.Box(0, 255, shape, np.uint8)


def frames(*shape, seed=0):
    return torch.from_numpy(np.random.default_rng(seed).integers(0, 256, shape, np.uint8))


def conv_output_shapes(encoder, obs):
    """Shapes ``(C, H, W)`` of each convolution's output (direct children of the trunk)."""
    shapes = []
    hooks = [
        layer.register_forward_hook(lambda m, i, out: shapes.append(tuple(out.shape[1:])))
        for layer in encoder.trunk
        if isinstance(layer, nn.Conv2d)
    ]
    features = encoder(obs)
    for hook in hooks:
        hook.remove()
    return shapes, features


# --- the papers' layer sizes --------------------------------------------------------------------


def test_batchnorm_cnn2_feature_maps_are_the_papers():
    # Lamb et al., Model 2: 80x80 -> 20x20 (16 channels) -> 10x10 (32), 3200 features.
    encoder = image_encoder(image_space(4, 80, 80), "batchnorm-cnn2")
    shapes, features = conv_output_shapes(encoder, frames(2, 4, 80, 80))
    assert shapes == [(16, 20, 20), (32, 10, 10)]
    assert features.shape == (2, 3200) and encoder.out_dim == 3200
    convs = [m for m in encoder.trunk if isinstance(m, nn.Conv2d)]
    assert [(c.kernel_size, c.stride, c.padding) for c in convs] == [
        ((8, 8), (4, 4), (2, 2)),
        ((4, 4), (2, 2), (1, 1)),
    ]
    assert sum(isinstance(m, nn.BatchNorm2d) for m in encoder.modules()) == 2


def test_batchnorm_cnn3_feature_maps_are_the_papers():
    # Model 3: the same two layers, then 4x4 stride 2 pad 0 -> 4x4 (32 channels), 512 features.
    encoder = image_encoder(image_space(4, 80, 80), "batchnorm-cnn3-lstm")
    shapes, features = conv_output_shapes(encoder, frames(2, 4, 80, 80))
    assert shapes == [(16, 20, 20), (32, 10, 10), (32, 4, 4)]
    assert features.shape == (2, 512)
    assert sum(isinstance(m, nn.BatchNorm2d) for m in encoder.modules()) == 3


def test_nature_cnn_shapes():
    encoder = image_encoder(image_space(4, 84, 84), "nature")
    shapes, features = conv_output_shapes(encoder, frames(3, 4, 84, 84))
    assert shapes == [(32, 20, 20), (64, 9, 9), (64, 7, 7)]
    assert encoder.fc.in_features == 7 * 7 * 64 and features.shape == (3, 512)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in encoder.modules())
    assert (features >= 0).all()  # ReLU after the FC layer


def test_impala_shapes():
    encoder = image_encoder(image_space(4, 84, 84), "impala")
    assert encoder(frames(2, 4, 84, 84)).shape == (2, 256)
    # Three stacks of conv + max-pool (84 -> 42 -> 21 -> 11), 32 channels at the end.
    assert encoder.fc.in_features == 32 * 11 * 11
    convs = [m for m in encoder.modules() if isinstance(m, nn.Conv2d)]
    assert [c.out_channels for c in convs] == [16] * 5 + [32] * 5 + [32] * 5
    assert sum(isinstance(m, nn.MaxPool2d) for m in encoder.modules()) == 3


def test_orthogonal_init_and_uint8_scaling():
    encoder = image_encoder(image_space(4, 84, 84), "nature")
    conv = encoder.trunk[0]
    weight = conv.weight.detach().flatten(1)  # [32, 4 * 8 * 8]
    torch.testing.assert_close(weight @ weight.T, 2.0 * torch.eye(32), atol=1e-4, rtol=0)
    assert not conv.bias.any()
    obs = frames(2, 4, 84, 84)
    assert encoder.scale == 1 / 255
    torch.testing.assert_close(encoder(obs), encoder(obs.float()))
    float_encoder = image_encoder(gym.spaces.Box(0.0, 1.0, (4, 84, 84)), "nature")
    assert float_encoder.scale == 1.0


def test_one_channel_images_and_bad_spaces():
    encoder = image_encoder(image_space(84, 84), "nature")
    assert encoder(frames(2, 84, 84)).shape == (2, 512)
    with pytest.raises(UnsupportedSpaceError, match="image observations"):
        image_encoder(gym.spaces.Box(-1, 1, (8,)), "nature")
    with pytest.raises(ConfigError, match="channel-last"):
        image_encoder(image_space(84, 84, 4), "nature")
    with pytest.raises(ValueError, match="mlp"):
        build_encoder(image_space(4, 84, 84), ModelConfig())


def test_batchnorm_cnn3_lstm_implies_lstm_256():
    assert ModelConfig(encoder="batchnorm-cnn3-lstm").lstm_hidden == 256
    assert ModelConfig(encoder="batchnorm-cnn3-lstm", lstm_hidden=256).lstm_hidden == 256
    with pytest.raises(ConfigError, match="lstm_hidden"):
        ModelConfig(encoder="batchnorm-cnn3-lstm", lstm_hidden=128)
    with pytest.raises(ConfigError, match="encoder"):
        ModelConfig(encoder="resnet")


# --- PPO, A2C and DQN on a fake image env -------------------------------------------------------


@pytest.mark.parametrize(
    ("encoder", "shared_trunk"),
    [(encoder, True) for encoder in ENCODERS] + [("nature", False), ("batchnorm-cnn2", False)],
)
def test_actor_critics_act_with_each_encoder(encoder, shared_trunk):
    env = FakeImageEnv()
    model_config = ModelConfig(encoder=encoder, shared_trunk=shared_trunk)
    obs = frames(3, 4, 84, 84)
    for module in (ppo, a2c):
        config_cls = ppo.PPOConfig if module is ppo else a2c.A2CConfig
        config = config_cls(model=model_config)
        model = module.build_model(config, env.observation_space, env.action_space)
        if encoder == "batchnorm-cnn3-lstm":
            assert isinstance(model, RecurrentActorCritic) and model.hidden_size == 256
            assert model.lstm.input_size == 512
            out, state = model.step(obs, model.initial_state(3))
            assert state.shape == (3, 2, 256)
        else:
            assert isinstance(model, ActorCritic)
            out = model.act(obs)
        assert out.actions.shape == (3,) and out.values.shape == (3,)
        assert torch.isfinite(out.log_probs).all()


@pytest.mark.parametrize("encoder", ["nature", "batchnorm-cnn2", "impala"])
def test_dqn_q_network_with_each_encoder(encoder):
    env = FakeImageEnv()
    config = dqn.DQNConfig(model=ModelConfig(encoder=encoder), dueling=True)
    network = dqn.build_model(config, env.observation_space, env.action_space)
    assert network(frames(5, 4, 84, 84)).shape == (5, 3, 1)
    assert network.act(frames(5, 4, 84, 84)).actions.shape == (5,)


def test_dqn_rejects_the_recurrent_model3():
    env = FakeImageEnv()
    config = dqn.DQNConfig(model=ModelConfig(encoder="batchnorm-cnn3-lstm"))
    with pytest.raises(ConfigError, match="recurrent"):
        QNetwork(env.observation_space, env.action_space, config, dqn.make_value_kind(config))


def test_mlp_encoder_still_flattens_images():
    env = FakeImageEnv()
    model = ActorCritic(env.observation_space, env.action_space, ModelConfig(hidden=(8,)))
    assert model.body.weights[0].shape == (2, 4 * 84 * 84, 8)
    assert model.act(frames(2, 4, 84, 84)).actions.shape == (2,)


@pytest.mark.filterwarnings("ignore:model.precision 'bfloat16' is emulated")
@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_ppo_trains_with_the_nature_cnn(registered_env, tmp_path, small_ppo, precision):
    """PPO trains the Nature CNN and checkpoints float32 weights in either precision; the
    loaded policy computes in the precision it was trained in."""
    env_id = registered_env("FakeImage-v0", FakeImageEnv)
    overrides = {"model.encoder": "nature", "model.shared_trunk": True}
    result = shoal.train(
        "ppo",
        env=env_id,
        seed=0,
        total_steps=64,
        run_dir=str(tmp_path / "run"),
        **small_ppo(**overrides, **{"model.precision": precision}),
    )
    assert result.env_steps == 64
    policy = shoal.load(result.run_dir)
    expected = torch.bfloat16 if precision == "bfloat16" else None
    assert policy.model.body.autocast_dtype == expected
    weights = policy.model.state_dict().values()
    assert all(w.dtype == torch.float32 for w in weights if w.is_floating_point())
    obs = np.stack([FakeImageEnv().reset(seed=s)[0] for s in range(2)])
    actions = policy.act(obs)
    assert actions.shape == (2,) and all(0 <= a < 3 for a in actions)
    # Deterministic actions are the modes of the deployed network's own distributions.
    with torch.no_grad():
        dist, _ = policy.model(torch.as_tensor(obs))
    np.testing.assert_array_equal(actions, dist.mode().numpy())


def test_runners_act_with_batch_norm_running_statistics(registered_env):
    """The acting copy's batch norm uses running statistics: with Lamb et al.'s Model 2, an
    env's action distribution depends on its own observation only, and acting leaves the
    running statistics alone."""
    from shoal.collect.env_runner import EnvRunner
    from shoal.config import EnvConfig

    env_id = registered_env("FakeImage-v0", FakeImageEnv)
    config = ModelConfig(encoder="batchnorm-cnn2", shared_trunk=True)
    runner = EnvRunner(
        EnvConfig(id=env_id, num_envs=4),
        lambda obs_space, action_space: ActorCritic(obs_space, action_space, config),
        num_steps=3,
        seed=0,
    )
    model = runner.model
    assert not any(m.training for m in model.modules() if isinstance(m, nn.BatchNorm2d))
    stats = {k: v.clone() for k, v in model.state_dict().items() if "running" in k}
    rollout, _ = runner.sample()
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in stats.items())
    obs = rollout.obs[0]
    with torch.no_grad():
        together = model(obs)[0].logits
        alone = torch.cat([model(obs[i : i + 1])[0].logits for i in range(4)])
    torch.testing.assert_close(together, alone)
    runner.close()


# --- bfloat16 mixed precision ---------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:model.precision 'bfloat16' is emulated")
@pytest.mark.parametrize("encoder", ENCODERS)
def test_bfloat16_encoders_match_float32_and_train_float32_weights(encoder):
    """Mixed precision computes the same features as float32 up to bfloat16 rounding (8 bits
    of mantissa), returns float32 features and float32 gradients, and keeps the weights in
    float32."""
    torch.manual_seed(0)
    space = image_space(4, 84, 84) if encoder == "nature" else image_space(1, 80, 80)
    full = image_encoder(space, encoder)
    mixed = image_encoder(space, encoder, "bfloat16")
    mixed.load_state_dict(full.state_dict())
    obs = frames(8, *space.shape)
    conv_dtypes = []
    first_conv = next(m for m in mixed.trunk.modules() if isinstance(m, nn.Conv2d))
    first_conv.register_forward_hook(lambda m, i, out: conv_dtypes.append(out.dtype))
    expected, got = full(obs), mixed(obs)
    assert conv_dtypes == [torch.bfloat16]  # the convolutions really compute in bfloat16
    assert got.dtype == torch.float32 and not torch.equal(got, expected)
    # Relative to the features' scale: each of the 2-7 layers rounds its inputs to bfloat16.
    assert (got - expected).abs().max() <= 0.05 * expected.abs().max()
    got.square().mean().backward()
    assert all(p.dtype == torch.float32 for p in mixed.parameters())
    grads = [p.grad for p in mixed.parameters() if p.requires_grad]
    assert grads and all(g is not None and g.dtype == torch.float32 for g in grads)
    assert all(torch.isfinite(g).all() for g in grads)


def test_reduced_precision_is_validated_and_warned_about_where_emulated(monkeypatch):
    with pytest.raises(ConfigError, match="precision"):
        ModelConfig(precision="float8", encoder="nature")
    for precision in ("bfloat16", "float16"):
        with pytest.raises(ConfigError, match="apply to the image encoders"):
            ModelConfig(precision=precision)  # encoder mlp
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    encoder = image_encoder(image_space(4, 84, 84), "nature", "bfloat16")
    with pytest.warns(UserWarning, match="emulated on this CPU"):
        encoder(frames(2, 4, 84, 84))  # warned where it computes, once
