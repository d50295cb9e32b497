"""R2D2 end to end on tiny settings: the runner records the state before each step, burn-in
steps carry no loss, smoke, NaN losses, exact resume with the replay saved, refusals."""

import math

import pytest
import torch
from state_helpers import assert_states_equal, metric_rows

import shoal
from shoal.algos.value import r2d2
from shoal.algos.value.r2d2 import R2D2, R2D2Config, R2D2Learner
from shoal.api import build_config
from shoal.config import ModelConfig
from shoal.core.errors import ConfigError, NaNLossError
from shoal.train.checkpoint import load_checkpoint

ITERATION_STEPS = 32  # 4 envs x 8 steps


def small(**extra):
    overrides = {
        "env.num_envs": 4,
        "num_steps": 8,
        "burn_in": 2,
        "length": 4,
        "period": 2,
        "model.hidden": (16,),
        "model.lstm_hidden": 8,
        "replay.batch_size": 4,
        "replay.learning_starts": 4,
        "replay.gradient_steps": 2,
        "target_update_every": 3,
        "run.eval_every_steps": 0,
        "run.checkpoint_every_steps": 0,
        "run.console": False,
        "run.tensorboard": False,
    }
    overrides.update(extra)
    return overrides


def test_rollouts_record_the_state_before_each_step():
    algorithm = R2D2(build_config("r2d2", seed=0, **small()))
    try:
        algorithm.train_iteration()  # a rollout: episodes may end and restart inside it
        rollout, _ = algorithm.core.sample()
        model = algorithm.learner.model
        state = rollout.policy_state
        for t in range(rollout.obs.shape[0]):
            assert torch.equal(rollout.step_states[t], state), t
            _, state = model.step(rollout.obs[t], state)
            # The runner zeroes the state after an autoreset step (the next episode's start).
            if t + 1 < rollout.obs.shape[0]:
                state = state * rollout.valid[t].view(-1, 1, 1).float()
    finally:
        algorithm.close()


def _batch(config, seed=0):
    g = torch.Generator().manual_seed(seed)
    n, steps = 3, config.burn_in + config.length
    return {
        "obs": torch.randn(n, steps + 1, 4, generator=g),
        "actions": torch.randint(0, 2, (n, steps), generator=g),
        "rewards": torch.randn(n, steps, generator=g),
        "terminated": torch.zeros(n, steps, dtype=torch.bool),
        "valid": torch.ones(n, steps, dtype=torch.bool),
        "starts": torch.zeros(n, steps + 1, dtype=torch.bool),
        "state": torch.randn(n, 2, config.model.lstm_hidden, generator=g),
    }


def test_burn_in_steps_carry_no_loss():
    config = build_config("r2d2", seed=0, **small(n_step=1))
    torch.manual_seed(0)
    learner = R2D2Learner(config, *_spaces())

    def td(batch):
        return r2d2.sequence_td(learner.model, learner.target, r2d2.time_major(batch), config)

    batch = _batch(config)
    base = td(batch)[1]
    assert base.shape == (config.length, 3)  # the learned steps only
    changed = {k: v.clone() for k, v in batch.items()}
    changed["rewards"][:, : config.burn_in] += 100.0
    changed["actions"][:, : config.burn_in] = 1 - changed["actions"][:, : config.burn_in]
    assert torch.equal(td(changed)[1], base)
    changed["rewards"][:, config.burn_in] += 1.0  # the first learned step
    assert not torch.equal(td(changed)[1], base)
    # The burn-in's observations do reach the loss: through the state they refresh.
    changed = {k: v.clone() for k, v in batch.items()}
    changed["obs"][:, 0] += 1.0
    assert not torch.equal(td(changed)[1], base)


def _spaces():
    import gymnasium as gym

    return gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2)


@pytest.mark.parametrize("env_id", ["CartPole-v1", "shoal/RepeatFirst-v0"])
def test_smoke(env_id, tmp_path):
    seen = []
    result = shoal.train(
        "r2d2", env=env_id, seed=0, total_steps=6 * ITERATION_STEPS,
        run_dir=str(tmp_path / "run"),
        on_iteration=lambda steps, metrics: seen.append(dict(metrics)), **small(),
    )  # fmt: skip
    assert result.iterations == 6
    learned = [m for m in seen if "loss/td" in m]
    assert learned and all(math.isfinite(m["loss/td"]) for m in learned)
    policy = shoal.load(result.run_dir)
    env = shoal.make_env(env_id, num_envs=3)
    actions = policy.act(env.reset(seed=1), episode_start=[True] * 3)
    assert actions.shape == (3,)
    env.close()


def test_nan_loss_names_the_loss(tmp_path, monkeypatch):
    real = r2d2.sequence_n_step_targets
    monkeypatch.setattr(r2d2, "sequence_n_step_targets", lambda *a: real(*a) * float("nan"))
    with pytest.raises(NaNLossError, match="loss/td"):
        shoal.train("r2d2", run_dir=str(tmp_path / "run"), total_steps=4 * ITERATION_STEPS,
                    **small())  # fmt: skip


def test_resume_is_exact(tmp_path):
    first, total = 3 * ITERATION_STEPS, 7 * ITERATION_STEPS
    overrides = small(**{"replay.save": True, "run.checkpoint_every_steps": ITERATION_STEPS})
    common = dict(env="shoal/CartPoleNoVelocity-v0", seed=5, **overrides)
    part = shoal.train("r2d2", total_steps=first, run_dir=str(tmp_path / "a"), **common)
    resumed = shoal.train(resume=part.run_dir, total_steps=total)
    straight = shoal.train("r2d2", total_steps=total, run_dir=str(tmp_path / "b"), **common)
    got, want = load_checkpoint(resumed.run_dir).state, load_checkpoint(straight.run_dir).state
    assert_states_equal(got["algorithm"], want["algorithm"])
    assert metric_rows(resumed.run_dir) == metric_rows(straight.run_dir)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"model": ModelConfig(lstm_hidden=None)}, "lstm_hidden"),
        ({"period": 40, "length": 20}, "period"),
        ({"burn_in": -1}, "burn_in"),
        ({"epsilon_end": 2.0}, "epsilon_end"),
    ],
)
def test_config_refusals(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        R2D2Config(**kwargs)


def test_continuous_actions_are_refused(tmp_path):
    with pytest.raises(shoal.core.errors.UnsupportedSpaceError, match="Discrete"):
        shoal.train("r2d2", env="Pendulum-v1", run_dir=str(tmp_path / "r"),
                    total_steps=ITERATION_STEPS, **small())  # fmt: skip
