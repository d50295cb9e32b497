"""PPO end to end on tiny settings: training, checkpoints, resume, errors, evaluation."""

import json
import math
import os
import signal

import gymnasium as gym
import numpy as np
import pytest
import torch
from state_helpers import assert_states_equal, metric_rows

import shoal
from shoal.algos.policy_gradient import ppo
from shoal.algos.policy_gradient.ppo import PPO, PPOConfig, PPOLearner, make_batch
from shoal.collect import EnvRunner
from shoal.collect.evaluate import evaluate
from shoal.config import EnvConfig, ModelConfig, RunConfig, replace
from shoal.core.errors import CheckpointError, NaNLossError, ShoalError, UnsupportedSpaceError
from shoal.core.seeding import derive_seed
from shoal.core.types import Rollout
from shoal.fast.backend import NumpyStep
from shoal.losses import gae, objectives
from shoal.train.checkpoint import load_checkpoint, resolve_checkpoint, save_checkpoint
from shoal.train.session import make_eval_env

# --- helpers ------------------------------------------------------------------------------------


def algorithm_state(run_dir):
    return load_checkpoint(run_dir).state["algorithm"]


def small_config(env_id="CartPole-v1", **kwargs):
    """A PPOConfig built directly (for tests that drive PPO / PPOLearner without the loop)."""
    env = EnvConfig(id=env_id, num_envs=4, **kwargs.pop("env", {}))
    return PPOConfig(
        env=env,
        model=ModelConfig(hidden=(16,)),
        num_steps=16,
        minibatch_size=32,
        num_epochs=2,
        **kwargs,
    )


# --- smoke --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env_id", "action_shape", "action_dtype"),
    [("CartPole-v1", (), np.int64), ("Pendulum-v1", (1,), np.float32)],
)
def test_ppo_smoke(env_id, action_shape, action_dtype, tmp_path, small_ppo, iteration_steps):
    seen = []
    result = shoal.train(
        "ppo",
        env=env_id,
        seed=0,
        total_steps=2 * iteration_steps,
        run_dir=str(tmp_path / "run"),
        on_iteration=lambda steps, metrics: seen.append((steps, dict(metrics))),
        **small_ppo(),
    )
    assert result.stop_reason == "total_steps" and not result.solved
    assert result.env_steps == 2 * iteration_steps and result.iterations == 2
    assert [steps for steps, _ in seen] == [iteration_steps, 2 * iteration_steps]
    for _, metrics in seen:
        for key in ("loss/policy", "loss/value", "loss/total", "train/approx_kl"):
            assert math.isfinite(metrics[key]), key
        assert metrics["train/epochs"] == 2
    assert result.checkpoint == result.run_dir / "checkpoints" / f"step_{2 * iteration_steps:012d}"
    assert (result.checkpoint / "state.pt").exists()
    assert json.loads((result.run_dir / "config.json").read_text())["env"]["id"] == env_id
    assert (result.run_dir / "metrics.jsonl").read_text().count("\n") == 2

    policy = shoal.load(result.run_dir)
    assert policy.config.env.id == env_id
    env = shoal.make_env(env_id, num_envs=5)
    obs = env.reset(seed=1)
    actions = policy.act(obs)
    assert actions.shape == (5, *action_shape) and actions.dtype == action_dtype
    assert all(env.action_space.contains(a) for a in actions)
    # Stochastic actions work too; deterministic ones are the distribution's mode.
    assert policy.act(obs, deterministic=False).shape == actions.shape
    np.testing.assert_array_equal(policy.act(obs), actions)
    env.close()


def test_env_steps_count_every_vector_step():
    algo = PPO(small_config())
    metrics = algo.train_iteration()
    assert algo.env_steps == 16 * 4 and algo.iteration == 1
    algo.train_iteration()
    assert algo.env_steps == 2 * 16 * 4 and algo.iteration == 2
    assert metrics["train/lr"] == algo.config.optim.lr
    # The sampler acts with the learner's latest weights.
    runner_state = algo.sampler.runner.model.state_dict()
    for name, tensor in algo.learner.model.state_dict().items():
        assert torch.equal(runner_state[name], tensor), name
    algo.close()


# --- batches and the update ---------------------------------------------------------------------


def sampled_rollout(max_episode_steps=5, seed=0):
    config = small_config(env={"max_episode_steps": max_episode_steps})
    torch.manual_seed(seed)
    runner = EnvRunner(
        config.env, lambda o, a: ppo.build_model(config, o, a), config.num_steps, seed=seed
    )
    rollout, _ = runner.sample()
    return config, runner, rollout


def test_make_batch_drops_autoreset_transitions_and_matches_gae():
    config, runner, rollout = sampled_rollout()
    assert not rollout.valid.all()  # short episodes: there are autoreset steps to drop
    batch = make_batch(rollout, gamma=0.9, lam=0.8)
    advantages, returns = gae(
        rollout.rewards,
        rollout.values,
        rollout.next_values,
        rollout.terminated,
        rollout.truncated,
        0.9,
        0.8,
    )
    keep = rollout.valid.flatten()
    n = int(keep.sum())
    assert batch.obs.shape == (n, 4) and batch.actions.shape == (n,)
    for field, full in [
        ("obs", rollout.obs),
        ("actions", rollout.actions),
        ("log_probs", rollout.log_probs),
        ("values", rollout.values),
        ("advantages", advantages),
        ("returns", returns),
    ]:
        assert torch.equal(getattr(batch, field), full.flatten(0, 1)[keep]), field
    runner.close()


def test_make_batch_hand_computed():
    """Two envs, three steps; env 1 terminates at t=0 and autoresets at t=1."""
    t_, b_ = 3, 2
    rollout = Rollout(
        obs=torch.arange(6.0).reshape(t_, b_, 1),
        actions=torch.zeros(t_, b_, dtype=torch.int64),
        log_probs=torch.zeros(t_, b_),
        values=torch.tensor([[1.0, 2.0], [1.0, 0.0], [1.0, 3.0]]),
        rewards=torch.tensor([[1.0, 5.0], [1.0, 0.0], [1.0, 1.0]]),
        terminated=torch.tensor([[False, True], [False, False], [False, False]]),
        truncated=torch.zeros(t_, b_, dtype=torch.bool),
        valid=torch.tensor([[True, True], [True, False], [True, True]]),
        last_values=torch.tensor([1.0, 4.0]),
    )
    batch = make_batch(rollout, gamma=0.5, lam=1.0)
    # env 0: deltas = r + 0.5 * v' - v = 0.5 each; A = 0.5 + 0.5 * A_next.
    # env 1: t=0 terminal: A = 5 - 2 = 3; t=2: A = 1 + 0.5 * 4 - 3 = 0. (t=1 is dropped.)
    # Flattened time-major order: (t0,e0), (t0,e1), (t1,e0), (t2,e0), (t2,e1).
    expected = torch.tensor([0.875, 3.0, 0.75, 0.5, 0.0])
    assert torch.allclose(batch.advantages, expected)
    assert torch.allclose(batch.returns, expected + torch.tensor([1.0, 2.0, 1.0, 1.0, 3.0]))
    assert batch.obs.flatten().tolist() == [0.0, 1.0, 2.0, 4.0, 5.0]


def model_snapshot(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_zero_learning_rate_leaves_weights_unchanged():
    config, runner, rollout = sampled_rollout()
    learner = PPOLearner(config, runner.env.observation_space, runner.env.action_space)
    learner.set_weights(runner.model.state_dict())
    batch = make_batch(rollout, config.gamma, config.gae_lambda)
    before = model_snapshot(learner.model)
    metrics = learner.update(batch, lr=0.0, clip_eps=0.2, kl_coeff=0.0)
    assert metrics["train/lr"] == 0.0 and metrics["train/epochs"] == config.num_epochs
    assert_states_equal(learner.model.state_dict(), before)
    # The same update with a learning rate does change them.
    learner.update(batch, lr=1e-2, clip_eps=0.2, kl_coeff=0.0)
    assert not all(torch.equal(before[k], v) for k, v in learner.model.state_dict().items())
    runner.close()


def test_minibatch_losses_hand_checkable_at_the_rollout_policy():
    config, runner, rollout = sampled_rollout()
    config = PPOConfig(**{**config.__dict__, "ent_coef": 0.01, "kl_coeff": 0.3})
    learner = PPOLearner(config, runner.env.observation_space, runner.env.action_space)
    learner.set_weights(runner.model.state_dict())
    batch = make_batch(rollout, config.gamma, config.gae_lambda)
    losses, stats = learner.losses(batch, clip_eps=0.2, kl_coeff=0.3)
    # Same policy as the rollout: ratio 1, so no KL, no clipping, and the surrogate is minus
    # the mean of the standardized advantages, which is 0.
    assert abs(stats["approx_kl"].item()) < 1e-6
    assert stats["clip_fraction"].item() == 0.0
    assert abs(losses["policy"].item()) < 1e-6
    assert abs(losses["kl"].item()) < 1e-6
    values = learner.model.value(batch.obs).detach()
    expected_value_loss = 0.5 * ((values - batch.returns) ** 2).mean()
    assert losses["value"].item() == pytest.approx(expected_value_loss.item(), rel=1e-5)
    entropy = learner.model.distribution(batch.obs).entropy().detach().mean()
    assert losses["entropy"].item() == pytest.approx(-entropy.item(), rel=1e-5)
    total = (
        losses["policy"]
        + config.vf_coef * losses["value"]
        + config.ent_coef * losses["entropy"]
        + losses["kl"]
    )
    assert losses["total"].item() == pytest.approx(total.item(), rel=1e-6)
    runner.close()


@pytest.mark.parametrize(("target_kl", "epochs"), [(1e-12, 1), (None, 4)])
def test_kl_early_stopping(target_kl, epochs):
    config, runner, rollout = sampled_rollout()
    config = PPOConfig(**{**config.__dict__, "num_epochs": 4, "target_kl": target_kl})
    learner = PPOLearner(config, runner.env.observation_space, runner.env.action_space)
    learner.set_weights(runner.model.state_dict())
    batch = make_batch(rollout, config.gamma, config.gae_lambda)
    metrics = learner.update(batch, lr=1e-2, clip_eps=0.2, kl_coeff=0.0)
    assert metrics["train/epochs"] == epochs
    runner.close()


def test_adaptive_kl_coefficient_is_reported_and_saved():
    algo = PPO(small_config(kl_coeff=0.2, kl_target=1e-9))
    metrics = algo.train_iteration()
    # The KL is far above the tiny target: the coefficient grows by 1.5.
    assert metrics["train/kl_coeff"] == pytest.approx(0.3)
    assert "loss/kl" in metrics
    assert algo.state_dict()["kl_coeff"] == pytest.approx(0.3)
    algo.close()


# --- unsupported spaces -------------------------------------------------------------------------


class MultiBinaryActionEnv(gym.Env):
    """A two-dimensional MultiBinary action: no policy head reads a grid of bits."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gym.spaces.MultiBinary([2, 2])

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(3, np.float32), {}

    def step(self, action):
        return np.zeros(3, np.float32), 0.0, False, False, {}


class DictObservationEnv(MultiBinaryActionEnv):
    """A Dict observation with a part no network can read (text)."""

    observation_space = gym.spaces.Dict(
        {"position": gym.spaces.Box(-1.0, 1.0, (2,), np.float32), "name": gym.spaces.Text(8)}
    )
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 0.0, False, False, {}


def test_unsupported_action_space(tmp_path, small_ppo, registered_env):
    env_id = registered_env("shoal-test/MultiBinary-v0", MultiBinaryActionEnv)
    with pytest.raises(
        UnsupportedSpaceError,
        match=r"action space MultiBinary\(\(2, 2\)\) is not supported; supported: Discrete",
    ):
        shoal.train("ppo", env=env_id, run_dir=str(tmp_path / "run"), **small_ppo())


def test_unsupported_observation_space(tmp_path, small_ppo, registered_env):
    env_id = registered_env("shoal-test/DictObs-v0", DictObservationEnv)
    with pytest.raises(UnsupportedSpaceError, match=r"observation part 'name' is a Text space"):
        shoal.train("ppo", env=env_id, run_dir=str(tmp_path / "run"), **small_ppo())


# --- failures during training -------------------------------------------------------------------


def test_nan_loss_stops_with_the_last_good_checkpoint(
    tmp_path, small_ppo, iteration_steps, monkeypatch
):
    poisoned = False
    real_value_loss = objectives.value_loss

    def value_loss(values, returns):
        loss = real_value_loss(values, returns)
        return loss * float("nan") if poisoned else loss

    def poison_after_second_iteration(steps, metrics):
        nonlocal poisoned
        poisoned = steps >= 2 * iteration_steps

    monkeypatch.setattr(objectives, "value_loss", value_loss)
    good = f"step_{2 * iteration_steps:012d}"
    with pytest.raises(NaNLossError) as info:
        shoal.train(
            "ppo",
            run_dir=str(tmp_path / "run"),
            total_steps=10 * iteration_steps,
            on_iteration=poison_after_second_iteration,
            **small_ppo(**{"run.checkpoint_every_steps": iteration_steps}),
        )
    message = str(info.value)
    assert "loss/value" in message
    assert f"env step {3 * iteration_steps}" in message
    assert good in message
    checkpoints = sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("step_*"))
    assert checkpoints[-1] == good  # nothing was saved after the NaN
    assert resolve_checkpoint(tmp_path / "run").name == good
    policy = shoal.load(tmp_path / "run")
    for tensor in policy.model.state_dict().values():
        assert torch.isfinite(tensor).all()


def train_signalled(tmp_path, small_ppo, iteration_steps, signum, handler, iterations):
    """PPO for ``iterations`` iterations with ``handler`` as the process's own handler of
    ``signum``, which the process is sent after its second iteration; returns the result and
    the handler in place when training ended. The process's handler is restored after."""

    def send_at_second_iteration(steps, metrics):
        if steps == 2 * iteration_steps:
            os.kill(os.getpid(), signum)

    previous = signal.signal(signum, handler)
    try:
        result = shoal.train(
            "ppo",
            run_dir=str(tmp_path / "run"),
            total_steps=iterations * iteration_steps,
            on_iteration=send_at_second_iteration,
            **small_ppo(),
        )
        return result, signal.getsignal(signum)
    finally:
        signal.signal(signum, previous)


@pytest.mark.parametrize(
    ("signum", "reason", "word"),
    [(signal.SIGINT, "interrupted", "Ctrl-C"), (signal.SIGTERM, "terminated", "SIGTERM")],
)
def test_a_stop_signal_finishes_the_iteration_and_saves(
    tmp_path, small_ppo, iteration_steps, capsys, signum, reason, word
):
    """Ctrl-C, and SIGTERM (`kill`, `timeout`, a batch scheduler's notice), stop the run
    after the iteration under way, with a checkpoint of it. Ctrl-C ends there; SIGTERM was
    only put off: it reaches the process's own handler once the run is saved."""
    # A stand-in handler, so that should shoal not install its own, the signal is recorded
    # here and the test fails instead of the signal ending the whole session.
    reached_outer = []
    latest = tmp_path / "run" / "checkpoints" / "latest"

    def outer_handler(received, frame):
        reached_outer.append((received, latest.exists() and latest.read_text().strip()))

    result, handler_after = train_signalled(
        tmp_path, small_ppo, iteration_steps, signum, outer_handler, iterations=10
    )
    saved = f"step_{2 * iteration_steps:012d}"
    # SIGTERM comes to the handler the process had, once the run is saved; Ctrl-C does not.
    assert reached_outer == ([(signal.SIGTERM, saved)] if signum == signal.SIGTERM else [])
    assert handler_after is outer_handler  # shoal restored the handler it replaced
    assert result.stop_reason == reason
    assert result.stop_detail.startswith(f"{reason} ({word}) at env step")
    assert result.env_steps == 2 * iteration_steps
    assert result.checkpoint.name == saved
    assert load_checkpoint(result.run_dir).meta["env_steps"] == 2 * iteration_steps
    shoal.load(result.run_dir)
    assert f"{word}: finishing this iteration and saving" in capsys.readouterr().out


def test_a_signal_the_process_ignores_stays_ignored(tmp_path, small_ppo, iteration_steps):
    """A process that ignores SIGTERM (SIG_IGN, as its parent may have set it) keeps training
    through one: shoal acts only on the signals the process would have acted on."""
    result, handler_after = train_signalled(
        tmp_path, small_ppo, iteration_steps, signal.SIGTERM, signal.SIG_IGN, iterations=4
    )
    assert handler_after is signal.SIG_IGN
    assert result.stop_reason == "total_steps" and result.env_steps == 4 * iteration_steps


def test_new_run_in_existing_run_dir_is_refused(tmp_path, small_ppo, iteration_steps):
    run_dir = str(tmp_path / "run")
    shoal.train("ppo", run_dir=run_dir, total_steps=iteration_steps, **small_ppo())
    with pytest.raises(ShoalError, match="--resume"):
        shoal.train("ppo", run_dir=run_dir, total_steps=iteration_steps, **small_ppo())


# --- determinism and exact resume ---------------------------------------------------------------


def test_same_seed_same_weights_different_seed_different(tmp_path, small_ppo, iteration_steps):
    def train(name, seed):
        result = shoal.train(
            "ppo",
            seed=seed,
            run_dir=str(tmp_path / name),
            total_steps=2 * iteration_steps,
            **small_ppo(),
        )
        return algorithm_state(result.run_dir)["learner"]["model"]

    first, again, other = train("a", 0), train("b", 0), train("c", 1)
    assert_states_equal(again, first)
    assert any(not torch.equal(other[k], first[k]) for k in first)


RESUME_CASES = [("CartPole-v1", "native", None), ("Pendulum-v1", "sync", 20)]


@pytest.mark.parametrize(("env_id", "vectorization", "max_episode_steps"), RESUME_CASES)
def test_resume_is_exact(
    env_id, vectorization, max_episode_steps, tmp_path, small_ppo, iteration_steps, capsys
):
    first, total = 3 * iteration_steps, 5 * iteration_steps
    overrides = small_ppo(
        **{
            "env.vectorization": vectorization,
            "env.max_episode_steps": max_episode_steps,
            "env.normalize_obs": True,
            "env.normalize_reward": True,
            "optim.lr_schedule": "linear",
            "optim.anneal_steps": total,
            "clip_schedule": "linear",
            "run.eval_every_steps": 2 * iteration_steps,
            "run.eval_episodes": 2,
            "run.checkpoint_every_steps": iteration_steps,
        }
    )
    run_a, run_b = str(tmp_path / "a"), str(tmp_path / "b")
    part = shoal.train("ppo", env=env_id, seed=4, total_steps=first, run_dir=run_a, **overrides)
    assert part.env_steps == first
    resumed = shoal.train(resume=part.run_dir, total_steps=total)
    straight = shoal.train("ppo", env=env_id, seed=4, total_steps=total, run_dir=run_b, **overrides)
    assert "could not be restored" not in capsys.readouterr().out
    assert resumed.run_dir == part.run_dir
    assert resumed.env_steps == straight.env_steps == total
    assert resumed.iterations == straight.iterations == 5
    assert resumed.eval_return == straight.eval_return

    got, want = load_checkpoint(resumed.run_dir).state, load_checkpoint(straight.run_dir).state
    # Model and optimizer, the environments mid-episode with their normalizer statistics,
    # counters, the loop's cadence and the torch generator: all bit-for-bit.
    assert_states_equal(got["algorithm"], want["algorithm"])
    assert_states_equal(got["rng"], want["rng"])
    assert got["loop"]["evaluations"] == want["loop"]["evaluations"] == 2
    stats = got["algorithm"]["sampler"]["runners"][0]["env"]
    assert stats["stats"]["count"] > 1  # reward normalizer (outermost wrapper)
    assert stats["inner"]["stats"]["mean"].shape == (3 if env_id == "Pendulum-v1" else 4,)

    # The metrics of the two halves, timings aside, are those of the straight run.

    assert metric_rows(resumed.run_dir) == metric_rows(straight.run_dir)


# --- checkpoints --------------------------------------------------------------------------------


def sample_state():
    return {
        "arrays": {
            "f32": np.linspace(0, 1, 5, dtype=np.float32),
            "f64_scalar": np.array(2.5),
            "i64": np.arange(6, dtype=np.int64).reshape(2, 3),
            "u8": np.array([[0, 255]], np.uint8),
            "bool": np.array([True, False]),
            "u32": np.array([2**32 - 1], np.uint32),
            "view": np.arange(10.0)[::3],  # non-contiguous
        },
        "nested": [{"tensor": torch.randn(3, 2)}, (np.array([1, 2], np.int16), "text")],
        "big_int": 2**100 + 7,
        "float": 0.1,
        "none": None,
        "flag": True,
    }


def test_checkpoint_round_trip(tmp_path):
    state = sample_state()
    config = {"env": {"id": "CartPole-v1"}}
    path = save_checkpoint(tmp_path, 123, "ppo", config, state)
    assert path == tmp_path / "checkpoints" / "step_000000000123"
    loaded = load_checkpoint(tmp_path, algo="ppo")
    assert loaded.path == path
    assert loaded.meta == {"format_version": 1, "algo": "ppo", "env_steps": 123}
    assert loaded.config == config
    assert_states_equal(loaded.state, state)
    assert isinstance(loaded.state["nested"][1], tuple)
    assert loaded.state["big_int"] == 2**100 + 7
    # Loading from the checkpoint directory itself works too.
    assert load_checkpoint(path).path == path


def test_checkpoint_latest_and_keep(tmp_path):
    for step in (10, 20, 30, 40):
        save_checkpoint(tmp_path, step, "ppo", {}, {"step": step}, keep=2)
    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.glob("step_*")) == [
        "step_000000000030",
        "step_000000000040",
    ]
    assert (root / "latest").read_text().strip() == "step_000000000040"
    assert load_checkpoint(tmp_path).state == {"step": 40}
    assert not [p.name for p in root.iterdir() if p.name.startswith(".")]  # no temporaries
    # Zero padding keeps lexical order numeric past a digit boundary.
    save_checkpoint(tmp_path, 1000, "ppo", {}, {"step": 1000}, keep=2)
    assert load_checkpoint(tmp_path).state == {"step": 1000}
    assert (root / "step_000000000030").exists() is False


def test_checkpoint_from_wrong_algo(tmp_path):
    save_checkpoint(tmp_path, 1, "ppo", {}, {})
    with pytest.raises(CheckpointError, match="written by 'ppo', not 'dqn'"):
        load_checkpoint(tmp_path, algo="dqn")


def test_missing_or_empty_checkpoint_dirs(tmp_path):
    with pytest.raises(CheckpointError, match="no such run or checkpoint directory"):
        load_checkpoint(tmp_path / "nope")
    with pytest.raises(CheckpointError, match="holds no checkpoint"):
        load_checkpoint(tmp_path)


@pytest.mark.parametrize(
    ("damage", "match"),
    [
        ("truncate_state", "state.pt unreadable"),
        ("garbage_state", "state.pt unreadable"),
        ("bad_meta", "metadata unreadable"),
        ("wrong_version", "format version 99"),
    ],
)
def test_damaged_checkpoints_raise_checkpoint_error(tmp_path, damage, match):
    path = save_checkpoint(tmp_path, 5, "ppo", {}, sample_state())
    state_file = path / "state.pt"
    if damage == "truncate_state":
        data = state_file.read_bytes()
        state_file.write_bytes(data[: len(data) // 2])
    elif damage == "garbage_state":
        state_file.write_bytes(os.urandom(256))
    elif damage == "bad_meta":
        (path / "meta.json").write_text("{not json")
    else:
        meta = json.loads((path / "meta.json").read_text())
        (path / "meta.json").write_text(json.dumps({**meta, "format_version": 99}))
    with pytest.raises(CheckpointError, match=match) as info:
        load_checkpoint(tmp_path)
    assert str(path) in str(info.value)


def test_checkpoint_refuses_arbitrary_objects(tmp_path):
    # weights_only loading: a pickled arbitrary object is reported, never executed.
    path = save_checkpoint(tmp_path, 5, "ppo", {}, {})
    torch.save({"evil": RunConfig()}, path / "state.pt")
    with pytest.raises(CheckpointError, match="state.pt unreadable"):
        load_checkpoint(tmp_path)


def test_failed_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    good = save_checkpoint(tmp_path, 10, "ppo", {}, {"value": np.arange(3)})

    def broken_save(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tmp_path, 20, "ppo", {}, {"value": np.arange(4)})
    monkeypatch.undo()
    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["latest", good.name]
    loaded = load_checkpoint(tmp_path)
    assert loaded.path == good
    np.testing.assert_array_equal(loaded.state["value"], np.arange(3))


# --- evaluation ---------------------------------------------------------------------------------


class PerEnvPolicy:
    """Row 0 always pushes left (falls in ~10 steps); other rows balance the pole (reach the
    time limit), so env 0 finishes several episodes before the others finish one."""

    def act(self, obs, deterministic=True):
        balance = (obs[:, 2] + 0.5 * obs[:, 3] > 0).astype(np.int64)
        balance[0] = 0
        return balance


def first_episode(seed, env_index, max_steps):
    env = gym.make("CartPole-v1", max_episode_steps=max_steps)
    obs, _ = env.reset(seed=seed)
    total, steps, done = 0.0, 0, False
    while not done:
        action = 0 if env_index == 0 else int(obs[2] + 0.5 * obs[3] > 0)
        obs, reward, terminated, truncated, _ = env.step(action)
        total, steps, done = total + reward, steps + 1, terminated or truncated
    env.close()
    return total, steps


def test_evaluate_uses_the_first_episode_of_each_env():
    num_envs, max_steps, seed = 4, 40, 7
    env = shoal.make_env(
        "CartPole-v1", num_envs=num_envs, max_episode_steps=max_steps, vectorization="sync"
    )
    metrics = evaluate(PerEnvPolicy(), env, seed=seed)
    env.close()
    # SyncVectorEnv seeds env i with seed + i.
    episodes = [first_episode(seed + i, i, max_steps) for i in range(num_envs)]
    returns = np.array([r for r, _ in episodes])
    lengths = np.array([n for _, n in episodes])
    assert returns[0] < 15 and (returns[1:] == max_steps).all()  # the scenario is as intended
    assert metrics["eval/return"] == pytest.approx(returns.mean())
    assert metrics["eval/return_std"] == pytest.approx(returns.std())
    assert metrics["eval/return_min"] == returns.min()
    assert metrics["eval/length"] == pytest.approx(lengths.mean())


def test_train_reports_evaluation(tmp_path, small_ppo, iteration_steps):
    seen = []
    result = shoal.train(
        "ppo",
        run_dir=str(tmp_path / "run"),
        total_steps=2 * iteration_steps,
        on_iteration=lambda steps, metrics: seen.append(metrics),
        **small_ppo(**{"run.eval_every_steps": iteration_steps, "run.eval_episodes": 3}),
    )
    assert all("eval/return" in metrics for metrics in seen)
    assert result.eval_return == seen[-1]["eval/return"]
    # The reported return is what the saved policy scores: the rewards of the first episode
    # of each of the 3 evaluation envs, summed here step by step, on envs seeded as the loop
    # seeds its second evaluation.
    policy = shoal.load(result.run_dir)
    env = make_eval_env(shoal.load(result.run_dir).config)
    obs = env.reset(seed=derive_seed(0, "eval", 1))
    totals, running = np.zeros(3), np.ones(3, bool)
    while running.any():
        step = env.step(policy.act(obs, deterministic=True))
        totals += np.where(running & ~step.autoreset, step.reward, 0.0)
        running &= ~(step.terminated | step.truncated)
        obs = step.obs
    env.close()
    assert result.eval_return == pytest.approx(totals.mean())


def test_target_return_stops_training(tmp_path, small_ppo, iteration_steps):
    result = shoal.train(
        "ppo",
        run_dir=str(tmp_path / "run"),
        total_steps=10 * iteration_steps,
        target_return=1.0,  # any episode reaches it
        **small_ppo(**{"run.eval_every_steps": iteration_steps, "run.eval_episodes": 2}),
    )
    assert result.solved and result.stop_reason == "target_return"
    assert result.env_steps == iteration_steps
    assert (result.checkpoint / "state.pt").exists()


def test_async_vectorization_trains_and_resumes_with_restarted_episodes(
    tmp_path, small_ppo, capsys
):
    """AsyncVectorEnv keeps env state in subprocesses: training and checkpoints work, and a
    resume restarts the episodes (and says so) instead of failing."""
    overrides = small_ppo(**{"env.vectorization": "async", "env.num_envs": 2})
    steps = 2 * 16 * 2  # two iterations of 2 envs x 16 steps
    run_dir = tmp_path / "run"
    first = shoal.train(
        "ppo", env="CartPole-v1", total_steps=steps, run_dir=str(run_dir), **overrides
    )
    assert first.env_steps == steps and (first.checkpoint / "state.pt").exists()
    resumed = shoal.train(resume=run_dir, total_steps=2 * steps)
    assert resumed.env_steps == 2 * steps
    assert "could not be restored mid-episode, so they restart" in capsys.readouterr().out


def test_checkpoint_of_another_model_layout_is_a_clear_error(tmp_path, small_ppo, iteration_steps):
    """A checkpoint whose weights do not fit the model built from its config (another shoal
    version, a hand-edited file) fails with CheckpointError, for loading and for resuming."""
    run_dir = tmp_path / "run"
    shoal.train("ppo", total_steps=iteration_steps, run_dir=str(run_dir), **small_ppo())
    checkpoint = load_checkpoint(run_dir)
    state = checkpoint.state
    for holder in (state["algorithm"]["policy"]["model"], state["algorithm"]["learner"]["model"]):
        holder["renamed.weight"] = holder.pop(next(iter(holder)))
    save_checkpoint(run_dir, 2 * iteration_steps, "ppo", checkpoint.config, state)
    with pytest.raises(CheckpointError, match="does not match the model"):
        shoal.load(run_dir)
    with pytest.raises(CheckpointError, match="renamed.weight"):
        shoal.train(resume=run_dir, total_steps=4 * iteration_steps)


def test_temperature_schedule_is_logged_shared_with_the_sampler_and_resumed_exactly(
    tmp_path, small_ppo, iteration_steps
):
    """Lamb et al.: the temperature anneals per iteration, the rollout and its update use the
    same one (it travels with the weights), and a resumed run continues the schedule exactly."""
    anneal = {"temperature": 2.0, "temperature_min": 0.5, "temperature_anneal": 4 * iteration_steps}
    model_overrides = {f"model.{k}": v for k, v in anneal.items()}
    algo = PPO(shoal.config.replace(small_config(), **model_overrides))
    for _ in range(2):
        algo.train_iteration()
        want = 2.0 - 1.5 * algo.env_steps / (4 * iteration_steps)
        for model in (algo.learner.model, algo.sampler.runner.model):
            assert model.policy_head.temperature.item() == pytest.approx(want)
    assert algo.state_dict()["counters"]["episodes"] == algo.core.episodes > 0
    algo.close()

    overrides = small_ppo(**model_overrides)
    first, total = 3 * iteration_steps, 5 * iteration_steps
    run_a, run_b = str(tmp_path / "a"), str(tmp_path / "b")
    part = shoal.train("ppo", seed=1, total_steps=first, run_dir=run_a, **overrides)
    resumed = shoal.train(resume=part.run_dir, total_steps=total)
    straight = shoal.train("ppo", seed=1, total_steps=total, run_dir=run_b, **overrides)
    rows = metric_rows(straight.run_dir)
    assert [row["train/temperature"] for row in rows] == pytest.approx(
        [2.0, 1.625, 1.25, 0.875, 0.5]
    )
    assert metric_rows(resumed.run_dir) == rows
    got, want = load_checkpoint(resumed.run_dir).state, load_checkpoint(straight.run_dir).state
    assert_states_equal(got["algorithm"], want["algorithm"])
    assert got["algorithm"]["learner"]["model"]["policy_head.temperature"].item() == 0.5


@pytest.mark.parametrize(
    ("env_id", "settings"),
    [
        ("CartPole-v1", {}),
        ("CartPole-v1", {"value_clip": 0.2, "ent_coef": 0.01, "kl_coeff": 0.3}),
        ("Pendulum-v1", {"ent_coef": 0.01, "value_clip": 0.5}),
    ],
)
def test_numpy_backend_update_equals_the_autograd_update(env_id, settings):
    """PPO's NumPy path (`shoal.fast`, taken for MLP models) trains the same weights as
    autograd over several epochs and minibatches, and logs the same metrics."""
    config = small_config(env_id, **settings)
    torch.manual_seed(0)
    runner = EnvRunner(config.env, lambda o, a: ppo.build_model(config, o, a), 16, seed=0)
    rollout, _ = runner.sample()
    batch = make_batch(rollout, config.gamma, config.gae_lambda)
    learners = []
    for backend in ("numpy", "torch"):
        learner_config = replace(config, **{"model.backend": backend})
        spaces = runner.env.observation_space, runner.env.action_space
        learner = PPOLearner(learner_config, *spaces)
        learner.set_weights(runner.model.state_dict())
        torch.manual_seed(1)  # the same minibatch shuffles
        learners.append((learner, learner.update(batch, 3e-3, 0.2, settings.get("kl_coeff", 0))))
    (direct, direct_metrics), (auto, auto_metrics) = learners
    for key, value in auto.model.state_dict().items():
        torch.testing.assert_close(direct.model.state_dict()[key], value, rtol=1e-4, atol=1e-6)
    assert direct_metrics.keys() == auto_metrics.keys()
    for key, value in auto_metrics.items():
        assert direct_metrics[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    runner.close()


def test_numpy_update_stops_before_a_non_finite_loss_is_applied():
    config = replace(small_config("CartPole-v1"), **{"model.backend": "numpy"})
    torch.manual_seed(0)
    runner = EnvRunner(config.env, lambda o, a: ppo.build_model(config, o, a), 16, seed=0)
    rollout, _ = runner.sample()
    batch = make_batch(rollout, config.gamma, config.gae_lambda)
    batch = batch._replace(returns=batch.returns.clone().fill_(float("nan")))
    learner = PPOLearner(config, runner.env.observation_space, runner.env.action_space)
    assert isinstance(learner.step, NumpyStep)
    before = {k: v.clone() for k, v in learner.model.state_dict().items()}
    with pytest.raises(NaNLossError, match="loss/value"):
        learner.update(batch, 3e-3, 0.2, 0.0)
    for key, value in learner.model.state_dict().items():
        torch.testing.assert_close(value, before[key])
    runner.close()
