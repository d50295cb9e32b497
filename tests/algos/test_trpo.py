"""TRPO on tiny settings: smoke runs, the trust-region step, the value regression, errors and
exact resume."""

import copy
import dataclasses
import math

import numpy as np
import pytest
import torch
from state_helpers import assert_states_equal, metric_rows

import shoal
from shoal.algos.policy_gradient import trpo
from shoal.algos.policy_gradient.ppo import make_batch
from shoal.algos.policy_gradient.trpo import TRPOConfig, TRPOLearner
from shoal.collect import EnvRunner
from shoal.config import EnvConfig, ModelConfig
from shoal.core.errors import ConfigError, NaNLossError
from shoal.registry import find_tuned, get_algorithm
from shoal.train.checkpoint import load_checkpoint

ITERATION_STEPS = 64  # 4 envs x 16 steps


def small_trpo(**extra):
    overrides = {
        "env.num_envs": 4,
        "num_steps": 16,
        "vf_minibatch_size": 32,
        "vf_epochs": 2,
        "model.hidden": (16,),
        "run.eval_every_steps": 0,
        "run.checkpoint_every_steps": 0,
        "run.console": False,
        "run.tensorboard": False,
    }
    overrides.update(extra)
    return overrides


@pytest.mark.parametrize(
    ("env_id", "action_shape", "action_dtype"),
    [("CartPole-v1", (), np.int64), ("Pendulum-v1", (1,), np.float32)],
)
def test_trpo_smoke(env_id, action_shape, action_dtype, tmp_path):
    seen = []
    result = shoal.train(
        "trpo",
        env=env_id,
        seed=0,
        total_steps=2 * ITERATION_STEPS,
        run_dir=str(tmp_path / "run"),
        on_iteration=lambda steps, metrics: seen.append(dict(metrics)),
        **small_trpo(),
    )
    assert result.env_steps == 2 * ITERATION_STEPS and result.iterations == 2
    for metrics in seen:
        for key in ("loss/policy", "loss/value", "train/kl", "train/step_fraction"):
            assert math.isfinite(metrics[key]), key
        assert metrics["train/kl"] <= 0.01
    assert (result.checkpoint / "state.pt").exists()

    policy = shoal.load(result.run_dir)
    env = shoal.make_env(env_id, num_envs=3)
    actions = policy.act(env.reset(seed=1))
    assert actions.shape == (3, *action_shape) and actions.dtype == action_dtype
    assert all(env.action_space.contains(a) for a in actions)
    env.close()


def test_registry_and_tuned_example():
    spec = get_algorithm("trpo")
    assert spec.config_cls is TRPOConfig and spec.algorithm_cls is trpo.TRPO
    config = find_tuned("trpo-cartpole").build_config()
    assert isinstance(config, TRPOConfig) and config.run.target_return == 475


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"max_kl": 0.0}, "max_kl"),
        ({"cg_iters": 0}, "cg_iters"),
        ({"cg_damping": -0.1}, "cg_damping"),
        ({"gae_lambda": 1.5}, "gae_lambda"),
        ({"vf_minibatch_size": 10_000}, "vf_minibatch_size"),
        ({"model": ModelConfig(shared_trunk=True)}, "model"),
    ],
)
def test_config_validation_names_the_field(kwargs, name):
    with pytest.raises(ConfigError, match=f"TRPOConfig.{name} "):
        TRPOConfig(**kwargs)


def learner_and_batch(env_id="CartPole-v1", **kwargs):
    config = TRPOConfig(
        env=EnvConfig(id=env_id, num_envs=4, max_episode_steps=20),
        model=ModelConfig(hidden=(16,)),
        num_steps=16,
        vf_minibatch_size=32,
        **kwargs,
    )
    torch.manual_seed(0)
    runner = EnvRunner(config.env, lambda o, a: trpo.build_model(config, o, a), 16, seed=0)
    rollout, _ = runner.sample()
    learner = TRPOLearner(config, runner.env.observation_space, runner.env.action_space)
    learner.set_weights(runner.model.state_dict())
    runner.close()
    return learner, make_batch(rollout, config.gamma, config.gae_lambda)


def snapshot(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_policy_step_respects_the_trust_region_and_moves_only_the_actor(env_id):
    learner, batch = learner_and_batch(env_id)
    before = snapshot(learner.model)
    old_model = copy.deepcopy(learner.model)
    metrics = learner.update_policy(batch)
    assert metrics["train/step_fraction"] > 0 and metrics["train/improvement"] > 0
    assert 0 < metrics["train/kl"] <= learner.config.max_kl
    after = snapshot(learner.model)
    # Stacked ParallelMLP tensors: member 0 is the actor, member 1 the critic.
    for name in before:
        if name.startswith("body."):
            assert not torch.equal(after[name][0], before[name][0]), name
            assert torch.equal(after[name][1], before[name][1]), name
        elif name.startswith("value_head."):
            assert torch.equal(after[name], before[name]), name
        elif env_id == "Pendulum-v1" and name == "policy_head.log_std":
            assert not torch.equal(after[name], before[name])
    # Its KL, recomputed independently, is the reported one.
    with torch.no_grad():
        old = old_model.distribution(batch.obs)
        new = learner.model.distribution(batch.obs)
    assert old.kl(new).mean().item() == pytest.approx(metrics["train/kl"], rel=1e-5)


def test_trust_region_per_action_dimension():
    """HalfCheetah's 6 action dimensions: the step's KL per dimension is at most max_kl (the
    whole KL up to 6 times it), and the step is the whole-KL step of max_kl and damping both
    6 times larger (Fisher F / 6: conjugate gradient's iterates scale by 6, its residuals
    are the same)."""
    per_dim, batch = learner_and_batch("HalfCheetah-v5")
    whole = copy.deepcopy(per_dim)
    whole.config = dataclasses.replace(
        per_dim.config, kl_per_action_dim=False, max_kl=6 * 0.01, cg_damping=6 * 0.1
    )
    old_model = copy.deepcopy(per_dim.model)
    metrics = per_dim.update_policy(batch)
    assert metrics["train/step_fraction"] > 0
    assert 0 < metrics["train/kl"] <= per_dim.config.max_kl
    with torch.no_grad():
        kl = old_model.distribution(batch.obs).kl(per_dim.model.distribution(batch.obs)).mean()
    assert kl.item() == pytest.approx(6 * metrics["train/kl"], rel=1e-5)
    assert kl.item() > per_dim.config.max_kl  # more than the whole-action region would allow
    whole_metrics = whole.update_policy(batch)
    assert whole_metrics["train/kl"] == pytest.approx(kl.item(), rel=1e-4)
    for name, value in whole.model.state_dict().items():
        torch.testing.assert_close(value, per_dim.model.state_dict()[name], atol=1e-5, rtol=1e-4)


def test_one_action_dimension_is_the_papers_trust_region():
    """A Discrete action has one dimension: kl_per_action_dim changes nothing."""
    learner, batch = learner_and_batch()
    paper = copy.deepcopy(learner)
    paper.config = dataclasses.replace(learner.config, kl_per_action_dim=False)
    assert learner.update_policy(batch) == paper.update_policy(batch)
    assert_states_equal(learner.model.state_dict(), paper.model.state_dict())


def test_value_regression_fits_returns_and_leaves_the_actor_alone():
    learner, batch = learner_and_batch(vf_epochs=3)
    before = snapshot(learner.model)
    loss0 = 0.5 * ((learner.model.value(batch.obs) - batch.returns) ** 2).mean().item()
    learner.update_value(batch)
    loss1 = 0.5 * ((learner.model.value(batch.obs) - batch.returns) ** 2).mean().item()
    assert loss1 < loss0
    after = learner.model.state_dict()
    for name in before:
        if name.startswith("body."):
            assert torch.equal(after[name][0], before[name][0]), name
        elif name.startswith("policy_head."):
            assert torch.equal(after[name], before[name]), name


def test_failed_line_search_restores_the_old_policy_exactly(monkeypatch):
    learner, batch = learner_and_batch(line_search_steps=3)
    before = snapshot(learner.model)
    real = learner._surrogate

    # The true surrogate for the gradient, a worse one for every candidate of the line search
    # (which runs without grad): every step is rejected.
    def surrogate(dist, b, advantages):
        return real(dist, b, advantages) - (0.0 if torch.is_grad_enabled() else 1.0)

    monkeypatch.setattr(learner, "_surrogate", surrogate)
    metrics = learner.update_policy(batch)
    assert metrics["train/step_fraction"] == 0.0 and metrics["train/kl"] == 0.0
    assert_states_equal(learner.model.state_dict(), before)


def test_zero_gradient_takes_no_step():
    learner, batch = learner_and_batch()
    before = snapshot(learner.model)
    metrics = learner.update_policy(batch._replace(advantages=torch.zeros_like(batch.advantages)))
    assert metrics["train/step_fraction"] == 0.0
    assert_states_equal(learner.model.state_dict(), before)


def test_nan_advantages_raise_and_leave_weights_unchanged():
    learner, batch = learner_and_batch()
    before = snapshot(learner.model)
    bad = batch._replace(advantages=batch.advantages * float("nan"))
    with pytest.raises(NaNLossError, match="loss/policy"):
        learner.update(bad)
    assert_states_equal(learner.model.state_dict(), before)
    with pytest.raises(NaNLossError, match="loss/value"):
        learner.update_value(batch._replace(returns=batch.returns * float("nan")))


def test_resume_is_exact(tmp_path, capsys):
    first, total = 2 * ITERATION_STEPS, 3 * ITERATION_STEPS
    overrides = small_trpo(
        **{
            "env.max_episode_steps": 20,
            "env.normalize_obs": True,
            "run.eval_every_steps": ITERATION_STEPS,
            "run.eval_episodes": 2,
            "run.checkpoint_every_steps": ITERATION_STEPS,
        }
    )
    run_a, run_b = str(tmp_path / "a"), str(tmp_path / "b")
    part = shoal.train("trpo", seed=4, total_steps=first, run_dir=run_a, **overrides)
    resumed = shoal.train(resume=part.run_dir, total_steps=total)
    straight = shoal.train("trpo", seed=4, total_steps=total, run_dir=run_b, **overrides)
    assert "could not be restored" not in capsys.readouterr().out
    assert resumed.env_steps == straight.env_steps == total
    assert resumed.eval_return == straight.eval_return
    got, want = load_checkpoint(resumed.run_dir).state, load_checkpoint(straight.run_dir).state
    assert_states_equal(got["algorithm"], want["algorithm"])
    assert_states_equal(got["rng"], want["rng"])
    assert metric_rows(resumed.run_dir) == metric_rows(straight.run_dir)
