"""ACKTR end to end on tiny settings: smoke (discrete and continuous), the trust region in
the metrics, NaN losses, exact resume, refusals."""

import math

import pytest
from state_helpers import assert_states_equal, metric_rows

import shoal
from shoal.algos.policy_gradient.acktr import ACKTRConfig
from shoal.config import ModelConfig, RunConfig
from shoal.core.errors import ConfigError, NaNLossError
from shoal.losses import objectives
from shoal.train.checkpoint import load_checkpoint

ITERATION_STEPS = 32  # 4 envs x 8 steps


def small(**extra):
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


@pytest.mark.parametrize(("env_id", "action_shape"), [("CartPole-v1", ()), ("Pendulum-v1", (1,))])
def test_smoke(env_id, action_shape, tmp_path):
    seen = []
    result = shoal.train(
        "acktr", env=env_id, seed=0, total_steps=3 * ITERATION_STEPS,
        run_dir=str(tmp_path / "run"),
        on_iteration=lambda steps, metrics: seen.append(dict(metrics)), **small(),
    )  # fmt: skip
    assert result.iterations == 3
    for metrics in seen:
        assert 0 < metrics["train/trust_region_scale"] <= 1
        assert all(math.isfinite(metrics[k]) for k in ("loss/policy", "loss/value", "loss/total"))
    policy = shoal.load(result.run_dir)
    env = shoal.make_env(env_id, num_envs=3)
    actions = policy.act(env.reset(seed=1))
    assert actions.shape == (3, *action_shape)
    env.close()


def test_nan_loss_names_the_loss(tmp_path, monkeypatch):
    monkeypatch.setattr(objectives, "value_loss", lambda v, r: (v - r).mean() * float("nan"))
    with pytest.raises(NaNLossError, match="loss/value"):
        shoal.train("acktr", run_dir=str(tmp_path / "run"), total_steps=ITERATION_STEPS, **small())


def test_resume_is_exact(tmp_path):
    first, total = 2 * ITERATION_STEPS, 5 * ITERATION_STEPS
    overrides = small(
        **{
            "env.normalize_obs": True,
            "optim.lr_schedule": "linear",
            "optim.anneal_steps": total,
            "kfac.inverse_every": 2,
            "run.checkpoint_every_steps": ITERATION_STEPS,
        }
    )
    run_a, run_b = str(tmp_path / "a"), str(tmp_path / "b")
    part = shoal.train("acktr", seed=5, total_steps=first, run_dir=run_a, **overrides)
    resumed = shoal.train(resume=part.run_dir, total_steps=total)
    straight = shoal.train("acktr", seed=5, total_steps=total, run_dir=run_b, **overrides)
    got, want = load_checkpoint(resumed.run_dir).state, load_checkpoint(straight.run_dir).state
    assert_states_equal(got["algorithm"], want["algorithm"])
    assert metric_rows(resumed.run_dir) == metric_rows(straight.run_dir)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"model": ModelConfig(lstm_hidden=16)}, "recurrent"),
        ({"model": ModelConfig(backend="numpy")}, "hooks"),
        ({"run": RunConfig(compile=True)}, "compiled"),
        ({"num_steps": 0}, "num_steps"),
    ],
)
def test_config_refusals(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        ACKTRConfig(**kwargs)


def test_kfac_settings_are_checked():
    with pytest.raises(ConfigError, match="damping"):
        shoal.api.build_config("acktr", **{"kfac.damping": 0.0})


def test_a_gaussian_policys_mean_head_gets_its_fisher_factor():
    """The Fisher statistics are taken at actions sampled as constants: a Gaussian's sample
    (``mean + std * eps``) left on the graph made its log-likelihood's gradient through the
    mean vanish, and the mean head's output factor G was zero (its steps then went
    unpreconditioned, scaled by 1 / damping). Hand check of one row: the score of a unit
    Gaussian at ``a`` with respect to its mean is ``a - mean``."""
    import gymnasium as gym
    import torch

    from shoal.algos.policy_gradient.acktr import ACKTRLearner, fisher_loss

    config = ACKTRConfig(model=ModelConfig(hidden=(8,), backend="torch"))
    torch.manual_seed(0)
    box = gym.spaces.Box(-1.0, 1.0, (2,))
    learner = ACKTRLearner(config, gym.spaces.Box(-1.0, 1.0, (3,)), box)
    obs = torch.randn(32, 3)
    with learner.kfac.record():
        dist, values = learner.model(obs)
    learner.kfac.accumulate(fisher_loss(dist, values, 1.0))
    head = next(layer for layer in learner.kfac.layers if layer.name == "policy_head.mean")
    factor_g = learner.kfac.state[head.weight]["G"]
    assert factor_g.abs().max() > 0.1  # about the identity for log_std 0
    torch.manual_seed(1)
    mean = torch.zeros(1, 2, requires_grad=True)
    unit = type(dist)(mean, torch.zeros(2))
    torch.manual_seed(1)
    (grad,) = torch.autograd.grad(fisher_loss(unit, torch.zeros(1), 0.0), mean)
    torch.manual_seed(1)
    drawn = torch.randn(1, 2)  # the sample fisher_loss drew: mean 0 + 1 * eps
    torch.testing.assert_close(grad, drawn)
