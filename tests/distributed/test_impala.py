"""IMPALA: config validation, the V-trace loss of the learner, the minibatch ring and replay,
smoke runs in-process and with Ray runners, checkpoints, NaN losses, and a learning test."""

import collections

import gymnasium as gym
import pytest
import torch
from in_process_ray import assert_ray_run_is_the_in_process_run
from state_helpers import assert_states_equal, metric_rows

import shoal
from shoal.algos.policy_gradient.impala import IMPALA, IMPALAConfig, IMPALALearner
from shoal.config import EnvConfig, ModelConfig, replace
from shoal.core.errors import ConfigError, NaNLossError
from shoal.core.types import Rollout
from shoal.losses import gae, objectives, vtrace
from shoal.train.checkpoint import load_checkpoint

ROLLOUT_STEPS = 32  # 4 envs x 8 steps
SPACES = (gym.spaces.Box(-1.0, 1.0, (4,)), gym.spaces.Discrete(2))
QUIET = {"run.console": False, "run.tensorboard": False}


def small(**extra):
    overrides = {
        "env.num_envs": 4,
        "num_steps": 8,
        "model.hidden": (16,),
        "run.eval_every_steps": 0,
        "run.checkpoint_every_steps": 0,
        **QUIET,
    }
    overrides.update(extra)
    return overrides


def small_config(**extra):
    return replace(IMPALAConfig(), **small(**extra))


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("num_steps", 0, "num_steps"),
        ("gamma", 1.5, "gamma"),
        ("vtrace_clip_rho_threshold", 0.0, "vtrace_clip_rho_threshold"),
        ("vtrace_clip_c_threshold", -1.0, "vtrace_clip_c_threshold"),
        ("train_batch_size", 100, "train_batch_size"),  # not a multiple of 50 * 8
        ("num_sgd_iter", 0, "num_sgd_iter"),
        ("minibatch_buffer_size", 0, "minibatch_buffer_size"),
        ("replay_proportion", -0.5, "replay_proportion"),
        ("replay_buffer_num_slots", 0, "replay_buffer_num_slots"),
        ("max_sample_requests_in_flight_per_worker", 0, "max_sample_requests_in_flight"),
        ("broadcast_interval", 0, "broadcast_interval"),
        ("optimizer", "sgd", "optimizer"),
        ("rms_decay", 1.0, "rms_decay"),
        ("entropy_coeff", -0.01, "entropy_coeff"),  # RLlib's sign: say it is a bonus
        ("vf_loss_coeff", -1.0, "vf_loss_coeff"),
        ("model", ModelConfig(lstm_hidden=8), "lstm_hidden"),
        ("env", EnvConfig(action_mask="info"), "action_mask"),
    ],
)
def test_config_validation(field, value, match):
    with pytest.raises(ConfigError, match=match):
        IMPALAConfig(**{field: value})


def _rollout(steps=5, envs=3, seed=0):
    """A random CartPole-shaped rollout with an episode end of each kind and an autoreset."""
    g = torch.Generator().manual_seed(seed)
    terminated = torch.zeros(steps, envs, dtype=torch.bool)
    truncated = torch.zeros(steps, envs, dtype=torch.bool)
    valid = torch.ones(steps, envs, dtype=torch.bool)
    terminated[1, 0], valid[2, 0] = True, False
    truncated[2, 1], valid[3, 1] = True, False
    return Rollout(
        obs=torch.randn(steps, envs, 4, generator=g),
        actions=torch.randint(2, (steps, envs), generator=g),
        log_probs=torch.rand(steps, envs, generator=g).log(),
        values=torch.zeros(steps, envs),
        rewards=torch.randn(steps, envs, generator=g),
        terminated=terminated,
        truncated=truncated,
        valid=valid,
        last_values=torch.randn(envs, generator=g),
    )


@pytest.mark.parametrize("use_vtrace", [True, False])
def test_losses_use_vtrace_on_valid_steps(use_vtrace):
    """The learner's losses, recomputed by hand: V-trace with the learner's log-probs and
    values (or, vtrace off, the on-policy n-step returns), autoreset steps left out."""
    config = IMPALAConfig(model=ModelConfig(hidden=(8,)), vtrace=use_vtrace, entropy_coeff=0.1)
    learner = IMPALALearner(config, *SPACES)
    rollout = _rollout()
    losses, _ = learner.losses(rollout)
    dist, values = learner.model(rollout.obs.flatten(0, 1))
    log_probs = dist.log_prob(rollout.actions.flatten()).view(5, 3)
    values, entropy = values.view(5, 3), dist.entropy().view(5, 3)
    next_values = torch.cat([values[1:], rollout.last_values[None]])
    flags = (rollout.terminated, rollout.truncated)
    if use_vtrace:
        vs, adv = vtrace(
            rollout.log_probs, log_probs, rollout.rewards, values, next_values, *flags, 0.99
        )
    else:
        adv, vs = gae(rollout.rewards, values, next_values, *flags, 0.99, 1.0)
    keep = rollout.valid
    expected = {
        "policy": -(log_probs * adv.detach())[keep].mean(),
        "value": 0.5 * ((values - vs.detach())[keep] ** 2).mean(),
        "entropy": -entropy[keep].mean(),
    }
    expected["total"] = expected["policy"] + 0.5 * expected["value"] + 0.1 * expected["entropy"]
    for name, value in expected.items():
        assert losses[name].item() == pytest.approx(value.item(), rel=1e-5, abs=1e-7), name


@pytest.mark.parametrize(
    ("optimizer", "cls"), [("rmsprop", torch.optim.RMSprop), ("adam", torch.optim.AdamW)]
)
def test_optimizers(optimizer, cls):
    config = IMPALAConfig(optimizer=optimizer, rms_decay=0.9, rms_momentum=0.5)
    learner = IMPALALearner(config, *SPACES)
    group = learner.optimizer.param_groups[0]
    assert isinstance(learner.optimizer, cls) and group["lr"] == 1e-3
    if optimizer == "rmsprop":
        assert group["alpha"] == 0.9 and group["momentum"] == 0.5


def test_minibatch_ring_reuses_batches():
    """num_sgd_iter 2 over a ring of 2 batches (RLlib's MinibatchBuffer): each batch gets two
    steps, interleaved with its neighbour, so the steps per arriving batch go 1, 3, 1, 3."""
    algo = IMPALA(small_config(num_sgd_iter=2, minibatch_buffer_size=2))
    steps = [algo.train_iteration()["train/sgd_steps"] for _ in range(4)]
    assert steps == [1, 3, 1, 3] and algo.updates == 8
    algo.close()


def test_replay_mixes_in_stored_rollouts():
    """replay_proportion 1: once the buffer holds more than a train batch (from the third
    rollout on), every new rollout brings one replayed rollout, trained on alone in the next
    iteration, so six iterations consume four new rollouts."""
    algo = IMPALA(small_config(replay_proportion=1.0, replay_buffer_num_slots=3))
    replayed = [algo.train_iteration()["train/replayed_rollouts"] for _ in range(6)]
    assert replayed == [0, 0, 1, 0, 1, 0]
    assert algo.env_steps == 4 * ROLLOUT_STEPS and len(algo._replay) == 3
    algo.close()


def test_train_batch_joins_rollouts_and_syncs_weights():
    algo = IMPALA(small_config(train_batch_size=2 * ROLLOUT_STEPS))
    metrics = algo.train_iteration()
    assert algo.env_steps == 2 * ROLLOUT_STEPS and algo.updates == 1
    assert metrics["train/policy_lag"] == 0  # in-process sampling is never stale
    runner_state = algo.sampler.runner.model.state_dict()
    for name, tensor in algo.learner.model.state_dict().items():
        assert torch.equal(runner_state[name], tensor), name
    algo.close()


def test_broadcast_interval_and_policy_versions(monkeypatch):
    """RLlib's broadcast rule, with two (simulated) runners and broadcast_interval 2: every
    arriving runner gets the current snapshot, which is refreshed every second arrival; the
    version each runner's next sample will use is queued for the policy-lag metric."""
    algo = IMPALA(small_config(broadcast_interval=2))
    sent = []
    monkeypatch.setattr(algo, "asynchronous", True)
    monkeypatch.setattr(algo, "_held", [0, 0])
    monkeypatch.setattr(algo, "_queued", [collections.deque(), collections.deque()])
    monkeypatch.setattr(algo.sampler, "set_weights", lambda w, runners: sent.append(runners))
    for runner in (0, 1, 0, 1):
        algo.updates += 1  # one learner update per arrival
        algo._sync(runner)
    # Arrival 1 keeps snapshot 0 (runner 0 holds it); arrival 2 refreshes it to version 2.
    assert sent == [[1], [0], [1]] and algo._held == [2, 4]
    assert list(algo._queued[0]) == [0, 2] and list(algo._queued[1]) == [2, 4]
    algo.close()


@pytest.mark.parametrize(("env_id", "action_shape"), [("CartPole-v1", ()), ("Pendulum-v1", (1,))])
def test_smoke_in_process(env_id, action_shape, tmp_path):
    seen = []
    result = shoal.train(
        "impala",
        env=env_id,
        seed=0,
        total_steps=2 * ROLLOUT_STEPS,
        run_dir=str(tmp_path / "run"),
        on_iteration=lambda steps, metrics: seen.append(dict(metrics)),
        **small(),
    )
    assert result.env_steps == 2 * ROLLOUT_STEPS and result.iterations == 2
    assert {"loss/policy", "loss/value", "loss/entropy", "train/rho_mean"} <= seen[-1].keys()
    policy = shoal.load(result.run_dir)
    env = shoal.make_env(env_id, num_envs=2)
    assert policy.act(env.reset(seed=1)).shape == (2, *action_shape)
    env.close()


def test_resume_in_process_is_exact(tmp_path):
    """Without Ray runners nothing is asynchronous, so a resumed run repeats the straight one."""
    overrides = small(**{"optim.lr_schedule": "linear", "optim.anneal_steps": 4 * ROLLOUT_STEPS})
    run_a, run_b = str(tmp_path / "a"), str(tmp_path / "b")
    part = shoal.train("impala", seed=3, total_steps=2 * ROLLOUT_STEPS, run_dir=run_a, **overrides)
    resumed = shoal.train(resume=part.run_dir, total_steps=4 * ROLLOUT_STEPS)
    straight = shoal.train(
        "impala", seed=3, total_steps=4 * ROLLOUT_STEPS, run_dir=run_b, **overrides
    )
    got, want = load_checkpoint(resumed.run_dir).state, load_checkpoint(straight.run_dir).state
    assert_states_equal(got["algorithm"], want["algorithm"])
    assert got["algorithm"]["counters"]["updates"] == 4
    assert metric_rows(resumed.run_dir) == metric_rows(straight.run_dir)


def test_nan_loss_names_the_loss(tmp_path, monkeypatch):
    # IMPALA's value term is the A2C objective's (`ValueRegression`).
    monkeypatch.setattr(objectives, "value_loss", lambda v, r: (v - r).mean() * float("nan"))
    with pytest.raises(NaNLossError, match="loss/value"):
        shoal.train("impala", seed=0, total_steps=ROLLOUT_STEPS, run_dir=str(tmp_path), **small())


def test_ray_runners_smoke_and_resume(in_process_ray, tmp_path):
    """Two runners (Ray's stand-in) streaming rollouts: the learner trains on each as it
    arrives, logs the policy lag, checkpoints, and a resumed run continues from the
    checkpoint."""
    seen = []
    overrides = small(**{"run.runners": 2, "run.checkpoint_every_steps": 2 * ROLLOUT_STEPS})
    result = shoal.train(
        "impala",
        seed=0,
        total_steps=4 * ROLLOUT_STEPS,
        run_dir=str(tmp_path / "run"),
        on_iteration=lambda steps, metrics: seen.append(dict(metrics)),
        **overrides,
    )
    assert result.env_steps == 4 * ROLLOUT_STEPS and result.iterations == 4
    lags = [m["train/policy_lag"] for m in seen]
    # The first rollout predates any update; the k-th can be at most k - 1 updates old.
    assert lags[0] == 0 and all(0 <= lag <= k for k, lag in enumerate(lags))
    state = load_checkpoint(result.run_dir).state["algorithm"]
    assert state["counters"]["updates"] == 4 and len(state["sampler"]["runners"]) == 2

    resumed = shoal.train(resume=result.run_dir, total_steps=6 * ROLLOUT_STEPS)
    assert resumed.env_steps == 6 * ROLLOUT_STEPS and resumed.iterations == 6
    state = load_checkpoint(resumed.run_dir).state["algorithm"]
    assert state["counters"]["updates"] == 6


def test_results_in_turn_make_the_ray_run_the_in_process_one(ray_session, tmp_path, monkeypatch):
    """Rollouts taken in turn from 2 Ray runners with 2 sample requests each in flight: the
    rollouts are stale, yet the run ends in the state (weights, optimizer, the runners'
    envs), bit for bit, and logs the metrics of the same seed's run with its runners called
    one after another in this process."""
    overrides = small(**{"run.runners": 2, "results_in_turn": True})
    _, rows = assert_ray_run_is_the_in_process_run(
        tmp_path, monkeypatch, "impala", 12 * ROLLOUT_STEPS, **overrides
    )
    assert len(rows) == 12
    assert max(row["train/policy_lag"] for row in rows) >= 2


def test_ray_runner_crash_is_survived(ray_session):
    """A runner killed while its sample requests are in flight is restarted with the latest
    weights; the stream re-issues its requests and training goes on."""
    algo = IMPALA(small_config(**{"run.runners": 1}))
    algo.train_iteration()
    algo.sampler.kill_runner(0)
    metrics = [algo.train_iteration() for _ in range(3)]
    assert algo.env_steps == 4 * ROLLOUT_STEPS and algo.updates == 4
    assert metrics[-1]["perf/sampler_restarts"] == algo.sampler.restarts == 1
    algo.close()


def test_tuned_example_builds():
    config = shoal.registry.find_tuned("impala-cartpole").build_config()
    assert isinstance(config, IMPALAConfig) and config.run.runners == 2
    assert config.run.target_return == 475


@pytest.mark.learning
def test_learns_cartpole_with_ray_runners(ray_session, tmp_path):
    """The tuned example (2 Ray runners x 16 envs, one V-trace update per rollout) reaches
    the deterministic evaluation mean of 475 over 20 episodes (CartPole-v1 solved) within
    150k env steps. Rollouts are taken in turn, so the run is the same however the runners
    are timed: seed 0 solves at 65,536 steps every time (seeds 0-4: 16k-66k, 6-17 s on 2
    cores). Taken as they arrived, seed 0 solved after 49k-65k steps on a quiet machine and
    once not within 150k beside the rest of the suite."""
    result = shoal.train(
        tuned="impala-cartpole",
        seed=0,
        total_steps=150_000,
        run_dir=str(tmp_path / "run"),
        results_in_turn=True,
        **QUIET,
    )
    assert result.solved and result.eval_return >= 475, result


@pytest.mark.slow
@pytest.mark.learning
def test_stays_solved_when_trained_on_past_the_target(ray_session, tmp_path):
    """Run on for 400k steps without a target, the tuned example stays solved: after the
    first evaluation >= 475, at least 60% of the evaluations are >= 475 and the last 100k
    steps average >= 400. (A single ReLU layer at lr 2e-3, the earlier tuning, held 5-29% and
    averaged 231-344 over 250k-500k steps on seeds 0-2: the cart drifted out at x = 2.4.)
    About 30 s per seed on 2 cores."""
    result = shoal.train(
        tuned="impala-cartpole",
        seed=1,
        total_steps=400_000,
        target_return=None,
        run_dir=str(tmp_path / "run"),
        results_in_turn=True,
        **QUIET,
    )
    rows = [r for r in metric_rows(result.run_dir) if "eval/return" in r]
    returns = [(r["step"], r["eval/return"]) for r in rows]
    first = next(step for step, value in returns if value >= 475)
    after = [value for step, value in returns if step > first]
    assert sum(value >= 475 for value in after) >= 0.6 * len(after), returns
    late = [value for step, value in returns if step > 300_000]
    assert sum(late) / len(late) >= 400, returns
