"""A3C: the worker's loss and gradient, the driver's asynchronous updates, Ray workers,
checkpoints, NaN losses and a fixed-seed learning test."""

import dataclasses
import math

import pytest
import torch
from in_process_ray import assert_ray_run_is_the_in_process_run
from state_helpers import assert_states_equal, metric_rows

import shoal
from shoal.algos.cores.rollout_batch import RolloutBatch, make_batch
from shoal.algos.policy_gradient import a3c
from shoal.algos.policy_gradient.a2c import A2CConfig, A2CLearner
from shoal.algos.policy_gradient.a3c import A3C, A2CBlock, A3CConfig, A3CWorker
from shoal.collect import EnvRunner
from shoal.collect.evaluate import evaluate
from shoal.config import (
    EnvConfig,
    ModelConfig,
    OptimConfig,
    RenamedFieldWarning,
    RunConfig,
    replace,
)
from shoal.core.errors import ConfigError, NaNLossError
from shoal.fast.backend import evaluate_objective
from shoal.losses import objectives
from shoal.losses.objectives import a2c_objective
from shoal.train.checkpoint import load_checkpoint

ROLLOUT_STEPS = 32  # 4 envs x 8 steps per gradient


def small(**extra):
    overrides = {
        "env.num_envs": 4,
        "a2c.num_steps": 8,
        "a2c.model.hidden": (16,),
        "run.runners": 0,
        "run.eval_every_steps": 0,
        "run.checkpoint_every_steps": 0,
        "run.console": False,
        "run.tensorboard": False,
    }
    overrides.update(extra)
    return overrides


def small_config(**changes):
    config = A3CConfig(
        run=RunConfig(runners=0),
        env=EnvConfig(num_envs=4),
        a2c=A2CBlock(
            model=ModelConfig(hidden=(16,)),
            optim=OptimConfig(lr=1e-3, max_grad_norm=0.5),
            num_steps=8,
            gae_lambda=0.95,
            ent_coef=0.01,
            optimizer="adam",
        ),
    )
    return replace(config, **changes)


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"a2c.num_steps": 0}, "num_steps"),
        ({"a2c.gae_lambda": 1.5}, "gae_lambda"),
        ({"a2c.optimizer": "sgd"}, "optimizer"),
        ({"a2c.ent_coef": -0.1}, "ent_coef"),
        ({"grads_per_iteration": 0}, "grads_per_iteration"),
        ({"a2c.model": ModelConfig(lstm_hidden=8)}, "model"),
        ({"a2c.model.backend": "numpy"}, "backend"),
        ({"a2c.run.seed": 3}, "set run and env at the top level"),
        (
            {"env": EnvConfig(normalize_obs=True), "run": RunConfig(runners=2)},
            "A3CConfig.env.*separate statistics",
        ),
    ],
)
def test_config_validation(changes, match):
    with pytest.raises(ConfigError, match=match):
        replace(A3CConfig(), **changes)


def test_old_flat_fields_land_in_the_a2c_block():
    with pytest.warns(RenamedFieldWarning) as caught:
        config = replace(A3CConfig(), num_steps=7, **{"optim.lr": 0.5})
    assert config.a2c.num_steps == 7 and config.a2c.optim.lr == 0.5
    messages = [str(w.message) for w in caught]
    assert "config field 'num_steps' is now 'a2c.num_steps' (the old name still works)" in messages
    assert "config field 'optim.lr' is now 'a2c.optim.lr' (the old name still works)" in messages


class FixedModel(torch.nn.Module):
    """A policy with uniform probabilities over two actions and given values."""

    def __init__(self, values):
        super().__init__()
        self.values = torch.nn.Parameter(torch.tensor(values))

    def forward(self, obs):
        logits = torch.zeros(obs.shape[0], 2)
        return torch.distributions.Categorical(logits=logits), self.values


def test_losses_hand_computed():
    """pi(a|s) = 1/2 everywhere, V = [1, 2], R = [2, 0], A = [2, 0]:
    policy = -mean(log(1/2) * A) = log 2; value = 0.5 * mean([1, 4]) = 1.25;
    entropy = -log 2; total = log 2 + 0.5 * 1.25 - 0.01 * log 2."""
    batch = RolloutBatch(
        obs=torch.zeros(2, 4),
        actions=torch.tensor([0, 1]),
        log_probs=torch.zeros(2),
        values=torch.zeros(2),
        advantages=torch.tensor([2.0, 0.0]),
        returns=torch.tensor([2.0, 0.0]),
    )
    model = FixedModel([1.0, 2.0])
    losses, _ = evaluate_objective(model, a2c_objective(0.5, 0.01), batch)
    log2 = math.log(2)
    assert losses["policy"].item() == pytest.approx(log2)
    assert losses["value"].item() == pytest.approx(1.25)
    assert losses["entropy"].item() == pytest.approx(-log2)
    assert losses["total"].item() == pytest.approx(log2 + 0.625 - 0.01 * log2)
    losses["total"].backward()
    # d total / d V_i = vf_coef * (V_i - R_i) / N = 0.5 * [-1, 2] / 2.
    assert model.values.grad.tolist() == pytest.approx([-0.25, 0.5])


def test_worker_gradient_is_the_clipped_a2c_gradient():
    """A worker's gradient on a rollout equals A2C's loss gradient on the same rollout,
    clipped to optim.max_grad_norm, computed in-process with A2C's own learner."""
    config = small_config(**{"a2c.ent_coef": 0.05})
    worker = A3CWorker(config, seed=11)
    weights = {k: v.clone() for k, v in worker.model.state_dict().items()}
    torch.manual_seed(7)  # the in-process runner samples actions from the global generator
    result = worker.compute_gradients(weights)

    a2c_config = config.learner_config()
    assert isinstance(a2c_config, A2CConfig) and a2c_config.ent_coef == 0.05
    env_config = dataclasses.replace(config.env, gamma=a2c_config.gamma)
    runner = EnvRunner(env_config, lambda o, a: a3c.build_model(config, o, a), 8, seed=11)
    learner = A2CLearner(a2c_config, runner.env.observation_space, runner.env.action_space)
    learner.model.load_state_dict(weights)
    runner.set_weights(weights)
    torch.manual_seed(7)
    rollout, _ = runner.sample()
    losses = learner.losses(make_batch(rollout, a2c_config.gamma, 0.95))
    losses["total"].backward()
    norm = torch.nn.utils.clip_grad_norm_(learner.parameters, 0.5)
    assert result.grad_norm == pytest.approx(float(norm)) and result.grad_norm > 0.5
    for got, parameter in zip(result.grads, learner.parameters, strict=True):
        torch.testing.assert_close(got, parameter.grad)
    assert result.losses["total"] == pytest.approx(losses["total"].item())
    assert result.env_steps == ROLLOUT_STEPS
    worker.close()
    runner.close()


def test_driver_applies_each_gradient_with_its_optimizer():
    """One iteration of two applied gradients: two optimizer steps on the driver's
    parameters, and the worker got the new weights with its next request."""
    algo = A3C(small_config(grads_per_iteration=2))
    before = [p.detach().clone() for p in algo.parameters]
    metrics = algo.train_iteration()
    assert algo.updates == 2 and algo.env_steps == 2 * ROLLOUT_STEPS and algo.iteration == 1
    assert algo.optimizer.state[algo.parameters[0]]["step"] == 2
    assert any(not torch.equal(b, p) for b, p in zip(before, algo.parameters, strict=True))
    assert metrics["train/staleness"] == 0  # one in-process worker is never behind
    for key in ("loss/policy", "loss/value", "loss/entropy", "loss/total", "train/grad_norm"):
        assert math.isfinite(metrics[key]), key
    algo.close()


def test_nan_loss_names_the_loss(tmp_path, monkeypatch):
    monkeypatch.setattr(objectives, "value_loss", lambda v, r: (v - r).mean() * float("nan"))
    with pytest.raises(NaNLossError, match="loss/value"):
        shoal.train("a3c", run_dir=str(tmp_path / "run"), total_steps=ROLLOUT_STEPS, **small())


def test_in_process_resume_is_exact(tmp_path):
    """run.runners 0: one worker in the driver's process, nothing asynchronous, so a
    resumed run repeats the straight one bit for bit."""
    total = 6 * ROLLOUT_STEPS
    overrides = small(
        **{
            "a2c.optim.lr_schedule": "linear",
            "a2c.optim.anneal_steps": total,
            "run.checkpoint_every_steps": 2 * ROLLOUT_STEPS,
        }
    )
    run_a, run_b = str(tmp_path / "a"), str(tmp_path / "b")
    part = shoal.train("a3c", seed=4, total_steps=3 * ROLLOUT_STEPS, run_dir=run_a, **overrides)
    resumed = shoal.train(resume=part.run_dir, total_steps=total)
    straight = shoal.train("a3c", seed=4, total_steps=total, run_dir=run_b, **overrides)
    assert resumed.env_steps == straight.env_steps == total
    got, want = load_checkpoint(resumed.run_dir).state, load_checkpoint(straight.run_dir).state
    assert_states_equal(got["algorithm"], want["algorithm"])
    assert_states_equal(got["rng"], want["rng"])
    assert metric_rows(resumed.run_dir) == metric_rows(straight.run_dir)


def test_ray_workers_smoke_restart_and_resume(ray_session, tmp_path):
    """Two Ray workers: gradients stream in and are applied on arrival, a killed worker is
    restarted, the state holds both workers' envs, and a new driver loaded from it goes on."""
    config = shoal.api.build_config("a3c", seed=0, **small(**{"run.runners": 2}))
    algo = A3C(config)
    seen = [algo.train_iteration()]
    algo.pool.kill(1)
    for _ in range(2):
        seen.append(algo.train_iteration())
    assert algo.pool.restarts >= 1 and seen[-1]["perf/worker_restarts"] >= 1
    assert algo.updates == 6 and algo.env_steps == 6 * ROLLOUT_STEPS
    # Both first requests carry the initial weights: the first gradient applied is fresh,
    # the other worker's is one update old unless the first worker delivered twice.
    assert seen[0]["train/staleness"] in (0.0, 0.5)
    assert all(m["train/staleness"] >= 0 for m in seen)
    assert all(math.isfinite(m["loss/total"]) for m in seen)
    state = algo.state_dict()
    assert len(state["workers"]) == 2
    env = shoal.make_env("CartPole-v1", num_envs=3)
    actions = algo.policy().act(env.reset(seed=1))
    assert actions.shape == (3,) and all(env.action_space.contains(a) for a in actions)
    env.close()
    algo.close()

    resumed = A3C(config)
    assert resumed.load_state_dict(state)  # CartPole's envs restore mid-episode
    assert resumed.updates == 6 and resumed.env_steps == 6 * ROLLOUT_STEPS
    for got, want in zip(resumed.parameters, algo.parameters, strict=True):
        assert torch.equal(got, want)
    resumed.train_iteration()
    assert resumed.updates == 8 and resumed.iteration == 4
    resumed.close()


def test_results_in_turn_make_the_ray_run_the_in_process_one(ray_session, tmp_path, monkeypatch):
    """Gradients of 2 Ray workers applied in turn: they are computed at once from stale
    weights, yet the run ends in the state (weights, optimizer statistics, the workers'
    envs), bit for bit, and logs the metrics of the same seed's run with its workers called
    one after another in this process."""
    overrides = small(**{"run.runners": 2, "results_in_turn": True})
    _, rows = assert_ray_run_is_the_in_process_run(
        tmp_path, monkeypatch, "a3c", 12 * ROLLOUT_STEPS, **overrides
    )
    assert len(rows) == 6
    assert max(row["train/staleness"] for row in rows) > 0


def test_tuned_example_builds():
    config = shoal.registry.find_tuned("a3c-cartpole").build_config()
    assert isinstance(config, A3CConfig) and config.run.runners == 2
    assert config.run.target_return == 475 and config.a2c.optimizer == "rmsprop"


@pytest.mark.learning
def test_learns_cartpole_with_two_workers(ray_session, tmp_path):
    """The tuned example with 2 Ray workers, seed 0, reaches an evaluation mean of 475 on
    CartPole-v1 within its 400k env steps. Gradients are applied in turn, so the run is the
    same however the workers are timed: seed 0 solves at 16,384 steps every time (seeds 0-3:
    16k-53k). Applied as they arrived, seeds 0-5 took 8k-123k on a quiet machine, and seed 0
    once more than 200k beside the rest of the test suite."""
    result = shoal.train(
        tuned="a3c-cartpole",
        seed=0,
        run_dir=str(tmp_path / "run"),
        results_in_turn=True,
        **{"run.console": False, "run.tensorboard": False},
    )
    assert result.solved and result.eval_return >= 475, result
    policy = shoal.load(result.run_dir)
    env = shoal.make_env("CartPole-v1", num_envs=20)
    metrics = evaluate(policy, env, seed=2024)
    env.close()
    assert metrics["eval/return"] >= 400, metrics
