"""A2C end to end on tiny settings: batches, optimizers, trunks, smoke, NaN losses, exact
resume."""

import math

import gymnasium as gym
import pytest
import torch
from state_helpers import assert_states_equal, metric_rows

import shoal
from shoal.algos.policy_gradient import a2c
from shoal.algos.policy_gradient.a2c import A2C, A2CConfig, A2CLearner
from shoal.algos.policy_gradient.ppo import make_batch
from shoal.api import build_config
from shoal.config import EnvConfig, ModelConfig, OptimConfig, replace
from shoal.core.errors import ConfigError, NaNLossError
from shoal.core.types import Rollout
from shoal.losses import objectives
from shoal.train.checkpoint import load_checkpoint

ITERATION_STEPS = 32  # 4 envs x 8 steps


def small_a2c(**extra):
    overrides = {
        "env.num_envs": 4,
        "num_steps": 8,
        "model.hidden": (16,),
        "run.eval_every_steps": 0,
        "run.checkpoint_every_steps": 0,
        "run.console": False,
        "run.tensorboard": False,
    }
    overrides.update(extra)
    return overrides


SPACES = (gym.spaces.Box(-1.0, 1.0, (4,)), gym.spaces.Discrete(2))


def test_n_step_returns_bootstrap_at_rollout_end_and_truncation():
    """gae_lambda = 1: n-step returns; env 0 is truncated at t=0 (bootstrap from its final
    observation's value 10), env 1 terminates at t=1, t=2 is its autoreset step."""
    F, T = False, True
    rollout = Rollout(
        obs=torch.arange(6.0).reshape(3, 2, 1),
        actions=torch.zeros(3, 2, dtype=torch.int64),
        log_probs=torch.zeros(3, 2),
        values=torch.tensor([[1.0, 1.0], [10.0, 1.0], [1.0, 7.0]]),
        rewards=torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0]]),
        terminated=torch.tensor([[F, F], [F, T], [F, F]]),
        truncated=torch.tensor([[T, F], [F, F], [F, F]]),
        valid=torch.tensor([[T, T], [T, T], [T, F]]),
        last_values=torch.tensor([4.0, 3.0]),
    )
    batch = make_batch(rollout, gamma=0.5, lam=1.0)
    # env 0: t0: 1 + 0.5 * 10 = 6; t1: 1 + 0.5 * (1 + 0.5 * 4) = 2.5; t2: 1 + 0.5 * 4 = 3.
    # env 1: t0: 1 + 0.5 * 1 = 1.5; t1: 1 (terminal); t2 dropped (autoreset).
    assert batch.returns.tolist() == [6.0, 1.5, 2.5, 1.0, 3.0]
    assert batch.obs.flatten().tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]


@pytest.mark.parametrize(
    ("optimizer", "cls"), [("rmsprop", torch.optim.RMSprop), ("adam", torch.optim.AdamW)]
)
def test_optimizers(optimizer, cls):
    config = A2CConfig(optimizer=optimizer, optim=OptimConfig(lr=1e-3, weight_decay=0.01))
    learner = A2CLearner(config, *SPACES)
    assert isinstance(learner.optimizer, cls)
    group = learner.optimizer.param_groups[0]
    assert group["weight_decay"] == 0.01 and group["eps"] == 1e-5
    if optimizer == "rmsprop":
        assert group["alpha"] == 0.99  # Mnih et al. 2016 / SB3


@pytest.mark.parametrize("shared", [True, False])
def test_losses_and_one_step(shared):
    torch.manual_seed(0)
    config = A2CConfig(model=ModelConfig(hidden=(8,), shared_trunk=shared), ent_coef=0.1)
    learner = A2CLearner(config, *SPACES)
    assert learner.model.shared_trunk == shared
    obs = torch.randn(6, 4)
    actions = torch.tensor([0, 1, 1, 0, 1, 0])
    advantages, returns = torch.randn(6), torch.randn(6)
    batch = a2c.RolloutBatch(obs, actions, torch.zeros(6), torch.zeros(6), advantages, returns)
    with torch.no_grad():
        dist, values = learner.model(obs)
    expected_policy = -(dist.log_prob(actions) * advantages).mean()
    expected_value = 0.5 * ((values - returns) ** 2).mean()
    expected_total = expected_policy + 0.5 * expected_value - 0.1 * dist.entropy().mean()
    before = {k: v.clone() for k, v in learner.model.state_dict().items()}
    metrics = learner.update(batch, lr=1e-2)  # reports the losses it stepped on
    assert metrics["loss/policy"] == pytest.approx(expected_policy.item(), rel=1e-5)
    assert metrics["loss/value"] == pytest.approx(expected_value.item(), rel=1e-5)
    # The total is a sum of float32 terms of order 1 that may nearly cancel: its rounding
    # error is absolute (a few 1e-8), not relative to the total.
    assert metrics["loss/total"] == pytest.approx(expected_total.item(), rel=1e-5, abs=1e-6)
    assert metrics["train/lr"] == 1e-2
    assert learner.optimizer.state[learner.parameters[0]]["step"] == 1  # one step per rollout
    assert any(not torch.equal(before[k], v) for k, v in learner.model.state_dict().items())


@pytest.mark.parametrize(
    ("action_space", "settings"),
    [
        (gym.spaces.Discrete(2), {"ent_coef": 0.1, "normalize_advantages": True}),
        (gym.spaces.Box(-1.0, 1.0, (2,)), {"ent_coef": 0.0, "optimizer": "adam"}),
    ],
)
def test_numpy_backend_step_equals_the_autograd_step(action_space, settings):
    """A2C's NumPy path (MLP models, `shoal.fast`) takes the same step and reports the same
    losses as autograd."""
    numpy_config = A2CConfig(model=ModelConfig(hidden=(8, 8), backend="numpy"), **settings)
    torch_config = replace(numpy_config, **{"model.backend": "torch"})
    torch.manual_seed(18)  # data whose float32 rounding differs most (over seeds 0-199)
    obs = torch.randn(6, 4)
    action_space.seed(0)
    actions = torch.stack([torch.as_tensor(action_space.sample()) for _ in range(6)])
    batch = a2c.RolloutBatch(
        obs, actions, torch.zeros(6), torch.zeros(6), torch.randn(6), torch.randn(6)
    )
    torch.manual_seed(0)
    direct = A2CLearner(numpy_config, SPACES[0], action_space)
    auto = A2CLearner(torch_config, SPACES[0], action_space)
    auto.set_weights(direct.get_weights())
    direct_metrics, auto_metrics = direct.update(batch, lr=1e-2), auto.update(batch, lr=1e-2)
    for key, value in auto.model.state_dict().items():
        # RMSprop's first step divides by the gradient's own magnitude, which scales float32
        # rounding differences (NumPy against PyTorch kernels) up to ~1e-5.
        torch.testing.assert_close(direct.model.state_dict()[key], value, rtol=1e-4, atol=2e-5)
    assert direct_metrics == pytest.approx(auto_metrics, rel=1e-5, abs=1e-7)


def test_iteration_counts_steps_and_syncs_weights():
    algo = A2C(A2CConfig(env=EnvConfig(num_envs=4), model=ModelConfig(hidden=(8,)), num_steps=5))
    algo.train_iteration()
    algo.train_iteration()
    assert algo.env_steps == 2 * 5 * 4 and algo.iteration == 2
    runner_state = algo.sampler.runner.model.state_dict()
    for name, tensor in algo.learner.model.state_dict().items():
        assert torch.equal(runner_state[name], tensor), name
    algo.close()


@pytest.mark.parametrize(("env_id", "action_shape"), [("CartPole-v1", ()), ("Pendulum-v1", (1,))])
def test_a2c_smoke(env_id, action_shape, tmp_path):
    seen = []
    result = shoal.train(
        "a2c",
        env=env_id,
        seed=0,
        total_steps=2 * ITERATION_STEPS,
        run_dir=str(tmp_path / "run"),
        on_iteration=lambda steps, metrics: seen.append(dict(metrics)),
        **small_a2c(),
    )
    assert result.env_steps == 2 * ITERATION_STEPS and result.iterations == 2
    assert (result.checkpoint / "state.pt").exists()
    for metrics in seen:
        for key in ("loss/policy", "loss/value", "loss/entropy", "loss/total"):
            assert math.isfinite(metrics[key]), key
    policy = shoal.load(result.run_dir)
    env = shoal.make_env(env_id, num_envs=3)
    actions = policy.act(env.reset(seed=1))
    assert actions.shape == (3, *action_shape)
    assert all(env.action_space.contains(a) for a in actions)
    env.close()


@pytest.mark.parametrize("activation", ["tanh", "silu"])
def test_nan_loss_names_the_loss(activation, tmp_path, monkeypatch):
    """tanh: the NumPy path; SiLU has no hand-written backward pass, so its update goes
    through autograd. Both read the loss from the objective's one definition."""
    nan_value = lambda v, r: (v - r).mean() * float("nan")  # noqa: E731
    monkeypatch.setattr(objectives, "value_loss", nan_value)
    with pytest.raises(NaNLossError, match="loss/value"):
        shoal.train(
            "a2c",
            run_dir=str(tmp_path / "run"),
            total_steps=ITERATION_STEPS,
            **small_a2c(**{"model.activation": activation}),
        )


@pytest.mark.parametrize(
    ("env_id", "vectorization", "max_episode_steps", "optimizer"),
    [("CartPole-v1", "native", None, "rmsprop"), ("Pendulum-v1", "sync", 20, "adam")],
)
def test_resume_is_exact(env_id, vectorization, max_episode_steps, optimizer, tmp_path):
    first, total = 2 * ITERATION_STEPS, 4 * ITERATION_STEPS
    overrides = small_a2c(
        **{
            "env.vectorization": vectorization,
            "env.max_episode_steps": max_episode_steps,
            "env.normalize_obs": True,
            "env.normalize_reward": True,
            "optimizer": optimizer,
            "optim.lr_schedule": "linear",
            "optim.anneal_steps": total,
            "run.checkpoint_every_steps": ITERATION_STEPS,
        }
    )
    run_a, run_b = str(tmp_path / "a"), str(tmp_path / "b")
    part = shoal.train("a2c", env=env_id, seed=5, total_steps=first, run_dir=run_a, **overrides)
    resumed = shoal.train(resume=part.run_dir, total_steps=total)
    straight = shoal.train("a2c", env=env_id, seed=5, total_steps=total, run_dir=run_b, **overrides)
    assert resumed.env_steps == straight.env_steps == total
    got, want = load_checkpoint(resumed.run_dir).state, load_checkpoint(straight.run_dir).state
    assert_states_equal(got["algorithm"], want["algorithm"])
    assert_states_equal(got["rng"], want["rng"])
    assert metric_rows(resumed.run_dir) == metric_rows(straight.run_dir)


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("num_steps", 0, "num_steps"),
        ("gae_lambda", 1.5, "gae_lambda"),
        ("optimizer", "sgd", "optimizer"),
        ("rms_alpha", 1.0, "rms_alpha"),
        ("ent_coef", -0.1, "ent_coef"),
    ],
)
def test_config_validation(field, value, match):
    with pytest.raises(ConfigError, match=match):
        A2CConfig(**{field: value})


def test_tuned_example_builds():
    config = shoal.registry.find_tuned("a2c-cartpole").build_config()
    assert isinstance(config, A2CConfig) and config.optimizer == "rmsprop"
    assert config.run.target_return == 475 and config.run.eval_episodes == 20


def test_the_sampler_acts_with_the_weights_of_the_latest_update():
    """`ModelLearner.get_weights` walks the model once and then hands out the same tensors:
    they must still carry every update and every load into the learner."""
    config = build_config("a2c", **small_a2c())
    algorithm = A2C(config)
    runner_model = algorithm.sampler.runner.model

    def assert_sampler_has_learner_weights():
        learner = algorithm.learner.model.state_dict()
        for name, value in runner_model.state_dict().items():
            torch.testing.assert_close(value, learner[name], rtol=0, atol=0)

    before = {k: v.clone() for k, v in algorithm.learner.model.state_dict().items()}
    for _ in range(2):
        algorithm.train_iteration()
        assert_sampler_has_learner_weights()
    changed = algorithm.learner.model.state_dict()
    assert any(not torch.equal(before[k], changed[k]) for k in before)
    algorithm.learner.model.load_state_dict(before)
    algorithm.core.broadcast()
    assert_sampler_has_learner_weights()
    algorithm.close()
