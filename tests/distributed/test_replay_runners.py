"""The replay learners on Ray runners (`shoal.algos.cores.off_policy.ReplayAlgorithm` with
``run.runners``): one synchronous runner is the in-process run, several store their envs side
by side and keep the updates per env step (on Ray's stand-in in this process), sampling ahead
is exact, a killed runner is replaced and the episodes it lost are cut from the replay."""

import copy

import numpy as np
import pytest
import torch

import shoal
from shoal.collect.evaluate import evaluate
from shoal.core.seeding import rng_state, set_rng_state
from shoal.registry import ALGORITHMS

SMALL = {
    "replay.learning_starts": 32,
    "replay.batch_size": 16,
    "replay.buffer_size": 2_000,
    "rollout_steps": 4,
    "env.num_envs": 2,
    "model.hidden": (16,),
}
FIELDS = ("obs", "actions", "rewards", "terminated", "truncated", "valid")
ENVS = {"dqn": "CartPole-v1", "qrdqn": "CartPole-v1", "rem": "CartPole-v1"}


def build(name, **settings):
    """The algorithm seeded as the training loop seeds it (the learner's initial weights come
    from the process's torch generator)."""
    spec = ALGORITHMS[name]
    env = {"env.id": ENVS.get(name, "Pendulum-v1")}
    config = spec.default_config(**{**env, **SMALL, "run.seed": 5, **settings})
    torch.manual_seed(11)
    return spec.algorithm_cls(config)


def train(algo, iterations):
    metrics = [algo.train_iteration() for _ in range(iterations)]
    return metrics


def weights(algo):
    return {k: v.clone() for k, v in algo.learner.get_weights().items()}


def assert_same(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.mark.parametrize("name", ["sac", "dqn"])
def test_one_synchronous_runner_is_the_in_process_run(name, ray_session):
    """The in-process runner draws its actions from a torch stream of its own, seeded as Ray
    runner 0 seeds its process: the same seed gives the same run either way."""
    runs = []
    for runners in (0, 1):
        algo = build(name, **{"run.runners": runners})
        try:
            train(algo, 24)
            stored = {f: getattr(algo.replay, f).copy() for f in FIELDS}
            runs.append((weights(algo), stored, algo.env_steps))
        finally:
            algo.close()
    (local, local_replay, local_steps), (ray, ray_replay, ray_steps) = runs
    assert local_steps == ray_steps == 24 * 4 * 2
    assert_same(local, ray)
    for field in FIELDS:
        np.testing.assert_array_equal(local_replay[field], ray_replay[field], err_msg=field)


@pytest.mark.parametrize("name", ["dqn", "qrdqn", "rem", "ddpg", "td3", "sac", "d4pg"])
def test_runners_store_their_envs_side_by_side_and_keep_updates_per_env_step(name, in_process_ray):
    algo = build(name, **{"run.runners": 2})
    try:
        assert algo.replay.num_envs == 4  # 2 runners x env.num_envs 2
        metrics = train(algo, 6)
        assert algo.env_steps == 6 * 4 * 4
        # gradient_steps 1 per rollout of env.num_envs envs: 2 per iteration of 2 runners,
        # from the first iteration past learning_starts (32 env steps: the third)
        assert metrics[-1]["train/grad_steps"] == 2 * 4
    finally:
        algo.close()


def test_sampling_ahead_is_exact_and_logs_its_lag(ray_session):
    """Rollout n acts with the weights of iteration n - max_lag, counted, not timed: two runs
    of one seed are identical, and so is a run resumed from a checkpoint taken mid-run. (On
    Ray both times: the rollouts sampled ahead come from a thread, which Ray's stand-in in
    this process cannot keep apart from the learner's random draws.)"""
    settings = {"run.runners": 2, "replay.max_lag": 2, "replay.save": True}
    first = build("sac", **settings)
    try:
        metrics = train(first, 6)
        assert [m["train/policy_lag"] for m in metrics] == [0, 1, 2, 2, 2, 2]
        # as a checkpoint holds them: copies (the state holds views of the live tensors)
        state, rng = copy.deepcopy(first.state_dict()), rng_state()
        train(first, 6)
        expected = weights(first)
    finally:
        first.close()
    again = build("sac", **settings)
    try:
        train(again, 12)
        assert_same(weights(again), expected)
    finally:
        again.close()
    resumed = build("sac", **settings)
    try:
        assert resumed.load_state_dict(state)  # mid-episode, with the rollouts sampled ahead
        set_rng_state(rng)
        train(resumed, 6)
        assert_same(weights(resumed), expected)
    finally:
        resumed.close()


def test_a_killed_runner_is_replaced_and_the_episodes_it_lost_are_cut(ray_session):
    algo = build("dqn", **{"run.runners": 2, "replay.n_step": 3})
    try:
        train(algo, 4)
        newest = (algo.replay._rows_written - 1) % algo.replay.rows
        before = (newest - 1) % algo.replay.rows
        assert algo.replay.valid[newest, 2:].all()  # CartPole: no episode ends this early
        algo.sampler.kill_runner(1)
        train(algo, 1)
        assert algo.sampler.restarts == 1
        # Runner 1's envs (2 and 3): their newest stored step lost what followed it, so it
        # is the autoreset row of an episode truncated one step earlier; runner 0's are kept.
        assert not algo.replay.valid[newest, 2:].any()
        assert algo.replay.truncated[before, 2:].all()
        assert algo.replay.valid[newest, :2].all() and not algo.replay.truncated[before, :2].any()
        metrics = train(algo, 4)
        assert np.isfinite(metrics[-1]["loss/td"]) and metrics[-1]["train/grad_steps"] > 0
    finally:
        algo.close()


@pytest.mark.learning
def test_sac_sampling_ahead_on_a_runner_swings_pendulum_up(ray_session, tmp_path):
    """The tuned SAC example with its envs on one Ray runner, sampling one iteration ahead
    of learning: it reaches the example's target (-200; random play scores about -1,230)."""
    result = shoal.train(
        tuned="sac-pendulum",
        seed=0,
        run_dir=str(tmp_path / "run"),
        **{"run.runners": 1, "replay.max_lag": 1, "run.console": False},
        **{"run.tensorboard": False, "run.checkpoint_every_steps": 0},
    )
    assert result.solved, result
    policy = shoal.load(result.run_dir)
    env = shoal.make_env("Pendulum-v1", num_envs=10)
    metrics = evaluate(policy, env, seed=2024)
    env.close()
    assert metrics["eval/return"] >= -275, metrics
