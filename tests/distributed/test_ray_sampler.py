"""RaySampler: same data as the local runner for the same seeds, streamed sampling, recovery
from killed runners and from exceptions in envs, and clear errors for bad set-ups."""

import dataclasses
import functools
import logging
import os
import sys
import time

import pytest
import torch

import shoal
import shoal.api
import shoal.distributed
from shoal.algos.policy_gradient.ppo import PPO, PPOConfig, build_model
from shoal.collect import EnvRunner, make_sampler
from shoal.collect.ray import RaySampler, concat_rollouts
from shoal.config import EnvConfig, RunConfig
from shoal.core.errors import ConfigError, DistributedError
from shoal.core.seeding import derive_seed
from shoal.distributed import require_ray

pytestmark = pytest.mark.usefixtures("ray_session")

CONFIG = PPOConfig(env=EnvConfig(num_envs=3), num_steps=20, minibatch_size=60)


# A partial of a shoal function pickles by reference: Ray actors cannot import test modules.
model_fn = functools.partial(build_model, CONFIG)


def reference_weights():
    torch.manual_seed(7)
    sampler_model = model_fn(*_cartpole_spaces())
    return sampler_model.state_dict()


def _cartpole_spaces():
    runner = EnvRunner(CONFIG.env, model_fn, 1, seed=0)
    spaces = runner.env.observation_space, runner.env.action_space
    runner.close()
    return spaces


def local_rollouts(run: RunConfig, weights, count: int, env: EnvConfig = CONFIG.env):
    """What runner ``i`` of a Ray sampler must produce: a local runner with its seeds."""
    out = []
    for i in range(run.runners):
        runner = EnvRunner(
            env,
            model_fn,
            CONFIG.num_steps,
            seed=derive_seed(run.seed, "env", i),
            torch_seed=derive_seed(run.seed, "runner-torch", i),
        )
        runner.set_weights(weights)
        # Clone: a local runner's rollout is a view of its storage, which the next one reuses.
        out.append([_cloned(*runner.sample()) for _ in range(count)])
        runner.close()
    return out


def _cloned(rollout, episodes):
    return rollout._replace(
        **{k: v.clone() for k, v in rollout._asdict().items() if v is not None}
    ), episodes


def assert_rollouts_equal(a, b):
    for name in a._fields:
        x, y = getattr(a, name), getattr(b, name)
        if x is None:
            assert y is None, name
        else:
            assert torch.equal(x, y), name


def test_ray_runners_sample_what_local_runners_sample_with_the_same_seeds():
    run = RunConfig(seed=3, runners=2)
    weights = reference_weights()
    sampler = make_sampler(CONFIG.env, model_fn, CONFIG.num_steps, run)
    try:
        assert isinstance(sampler, RaySampler)
        assert sampler.num_envs == 6 and sampler.agents_per_env == 1
        sampler.set_weights(weights)
        got = [sampler.sample() for _ in range(2)]
    finally:
        sampler.close()
    expected = local_rollouts(run, weights, 2)
    for k in range(2):
        joined = concat_rollouts([expected[i][k][0] for i in range(2)])
        assert joined.obs.shape[:2] == (CONFIG.num_steps, 6)
        assert_rollouts_equal(got[k][0], joined)
        returns = [expected[i][k][1].returns for i in range(2)]
        assert got[k][1].returns.tolist() == [r for part in returns for r in part.tolist()]


def test_one_ray_runner_matches_the_local_sampler_seed():
    """Runner 0 seeds its envs as `LocalSampler` does, so observations agree step by step
    (actions differ only through the torch generator, which each process owns)."""
    run = RunConfig(seed=5, runners=1)
    local = make_sampler(
        CONFIG.env, model_fn, CONFIG.num_steps, dataclasses.replace(run, runners=0)
    )
    remote = make_sampler(CONFIG.env, model_fn, CONFIG.num_steps, run)
    try:
        assert torch.equal(
            torch.as_tensor(local.runner.obs),
            torch.tensor(remote.pool.call_one(0, "get_state")["obs"]),
        )
    finally:
        local.close()
        remote.close()


def test_stream_yields_each_runner_and_weights_go_to_one_runner():
    run = RunConfig(seed=1, runners=2)
    sampler = make_sampler(CONFIG.env, model_fn, CONFIG.num_steps, run)
    try:
        sampler.set_weights(reference_weights())
        seen = []
        stream = sampler.stream(in_flight=1)
        for i, rollout, _ in stream:
            assert rollout.obs.shape[:2] == (CONFIG.num_steps, 3)
            seen.append(i)
            zeros = {k: torch.zeros_like(v) for k, v in reference_weights().items()}
            sampler.set_weights(zeros, runners=[i])
            # Which runner is faster is timing (on a loaded machine one can deliver several
            # rollouts before the other's first): go on until both have, within a bound.
            if (len(seen) >= 4 and set(seen) == {0, 1}) or len(seen) == 200:
                break
        stream.close()
        assert set(seen) == {0, 1}
        # Zero weights: uniform logits, value 0 everywhere.
        rollout, _ = sampler.sample()
        assert torch.all(rollout.values == 0)
    finally:
        sampler.close()


def test_a_killed_runner_restarts_with_its_seed_and_the_latest_weights(caplog):
    run = RunConfig(seed=2, runners=2)
    weights = reference_weights()
    sampler = make_sampler(CONFIG.env, model_fn, CONFIG.num_steps, run)
    try:
        sampler.set_weights(weights)
        sampler.kill_runner(1)
        with caplog.at_level(logging.WARNING, logger="shoal.distributed"):
            rollout, _ = sampler.sample()
        assert sampler.restarts == 1
        assert "sampler 1 failed" in caplog.text and "restarting" in caplog.text
    finally:
        sampler.close()
    # The restarted runner starts over from its seeds: its first rollout is a fresh one's.
    expected = local_rollouts(run, weights, 1)
    fresh = concat_rollouts([expected[0][0][0], expected[1][0][0]])
    assert_rollouts_equal(rollout, fresh)


def test_one_killed_worker_counts_as_one_restart_when_a_call_finds_it_first():
    """The owner of a stream can find a death first (IMPALA's weight acks do): the stream's
    own requests to the dead worker are then re-issued to its replacement, not counted as a
    second restart (which would also halve max_worker_restarts)."""
    from shoal.distributed.ray_workers import WorkerPool

    class SlowWorker:  # defined here so that Ray ships it by value to its workers
        """Calls take a while, so a request is still running when the worker is killed."""

        def work(self) -> int:
            time.sleep(0.3)
            return os.getpid()

        def ping(self) -> int:
            return os.getpid()

    pool = WorkerPool(SlowWorker, lambda i: (), 1, name="worker", max_restarts=5)
    try:
        stream = pool.stream("work", in_flight=2)
        first_pid = next(stream)[1]
        pool.kill(0)  # the second request is still running
        assert pool.call_one(0, "ping") != first_pid and pool.restarts == 1
        pids = [next(stream)[1] for _ in range(3)]
        stream.close()
        assert pool.restarts == 1 and pids[-1] != first_pid
    finally:
        pool.close()


def test_stream_in_turn_takes_results_in_worker_order():
    """Worker 0 is much slower than worker 1 (taken as they finish, worker 1's results
    would come first and most often); in turn, the order is 0, 1, 0, 1, ... and each new
    request is sent the arguments of the moment its worker's result was taken."""
    from shoal.distributed.ray_workers import WorkerPool

    class Delayed:  # defined here so that Ray ships it by value to its workers
        def __init__(self, delay: float):
            self.delay = delay

        def work(self, sent: int) -> int:
            time.sleep(self.delay)
            return sent

    pool = WorkerPool(Delayed, lambda i: ((0.3, 0.0)[i],), 2, name="worker")
    try:
        taken = []
        stream = pool.stream("work", lambda i: (len(taken),), in_turn=True)
        for i, sent in stream:
            taken.append((i, sent))
            if len(taken) == 5:
                break
        stream.close()
        # The first two requests were sent at the start (0 taken); worker 0's second was
        # sent once 1 result was taken, worker 1's once 2 were, and so on.
        assert taken == [(0, 0), (1, 0), (0, 1), (1, 2), (0, 3)]
    finally:
        pool.close()


def test_impala_counts_a_killed_runner_once():
    """IMPALA over 2 Ray runners, one killed mid-run: exactly one restart is reported."""
    from shoal.algos.policy_gradient.impala import IMPALA, IMPALAConfig

    config = IMPALAConfig(
        run=RunConfig(seed=0, runners=2, total_steps=10_000),
        env=EnvConfig(id="CartPole-v1", num_envs=2),
        num_steps=8,
    )
    algo = IMPALA(config)
    try:
        for _ in range(3):
            algo.train_iteration()
        algo.sampler.kill_runner(0)
        metrics = [algo.train_iteration() for _ in range(12)]
        assert algo.sampler.restarts == 1
        assert metrics[-1]["perf/sampler_restarts"] == 1
    finally:
        algo.close()


def test_an_exception_in_an_env_restarts_the_runner(tmp_path, caplog):
    flag = tmp_path / "fail-once"
    flag.touch()
    env = EnvConfig(id="flaky_env:FlakyCartPole-v0", num_envs=2, kwargs={"fail_flag": str(flag)})
    run = RunConfig(runners=1)
    sampler = make_sampler(env, model_fn, 8, run)
    try:
        sampler.set_weights(reference_weights())
        with caplog.at_level(logging.WARNING, logger="shoal.distributed"):
            rollout, _ = sampler.sample()
        assert not flag.exists()
        assert sampler.restarts == 1
        assert "RuntimeError: injected env failure" in caplog.text
        assert rollout.obs.shape[:2] == (8, 2)
    finally:
        sampler.close()


def test_a_runner_that_keeps_failing_stops_the_run_with_a_clear_error():
    run = RunConfig(runners=1)
    sampler = make_sampler(CONFIG.env, model_fn, CONFIG.num_steps, run)
    try:
        broken = {"not a parameter": torch.zeros(1)}
        with pytest.raises(DistributedError, match="sampler 0 failed 4 times in a row"):
            sampler.set_weights(broken)  # every restart is given these weights again
            sampler.sample()
    finally:
        sampler.close()


def test_ppo_keeps_training_after_a_runner_is_killed_mid_run(small_ppo):
    """PPO over 2 Ray runners: after runner 0's process is killed between iterations, the
    next iteration restarts it, trains on a full rollout and reports the restart."""
    config = shoal.api.build_config("ppo", **small_ppo(**{"run.runners": 2}))
    algorithm = PPO(config)
    try:
        first = algorithm.train_iteration()
        assert "perf/sampler_restarts" not in first
        algorithm.sampler.kill_runner(0)
        after = algorithm.train_iteration()
        assert after["perf/sampler_restarts"] == 1
        assert algorithm.env_steps == 2 * 2 * 4 * 16  # iterations x runners x envs x steps
        assert all(torch.isfinite(p).all() for p in algorithm.learner.model.parameters())
    finally:
        algorithm.close()


def test_normalization_with_several_runners_is_refused():
    env = EnvConfig(normalize_obs=True)
    with pytest.raises(ConfigError, match="normalize_obs"):
        make_sampler(env, model_fn, 4, RunConfig(runners=2))


def test_a_bad_cluster_address_gets_a_clear_message():
    module = require_ray()
    with pytest.raises(DistributedError, match="HOST:PORT"):
        module._check_reachable("not-an-address")
    with pytest.raises(DistributedError, match="no Ray cluster answers at '127.0.0.1:1'"):
        module._check_reachable("127.0.0.1:1")


def test_missing_ray_gets_a_clear_message(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray now raises ImportError
    monkeypatch.delitem(sys.modules, "shoal.distributed.ray_workers", raising=False)
    monkeypatch.delattr(shoal.distributed, "ray_workers", raising=False)
    with pytest.raises(DistributedError, match=r"pip install 'shoal\[ray\]'"):
        require_ray()


def test_ppo_with_ray_runners_resumes_exactly(tmp_path, small_ppo, iteration_steps, monkeypatch):
    """N + M steps straight on 2 Ray runners = N steps + resume + M steps, each runner's envs
    and torch generator in the checkpoint (the second run on Ray's stand-in in this process,
    which is the same run: the runners are called in turn either way)."""
    from in_process_ray import use_in_process_ray
    from state_helpers import assert_states_equal

    from shoal.train.checkpoint import load_checkpoint

    per_iteration = 2 * iteration_steps  # 2 runners
    overrides = small_ppo(**{"run.runners": 2, "run.checkpoint_every_steps": per_iteration})
    first, total = 2 * per_iteration, 3 * per_iteration
    run_a, run_b = str(tmp_path / "a"), str(tmp_path / "b")
    straight = shoal.train("ppo", seed=4, total_steps=total, run_dir=run_b, **overrides)
    use_in_process_ray(monkeypatch)
    part = shoal.train("ppo", seed=4, total_steps=first, run_dir=run_a, **overrides)
    resumed = shoal.train(resume=part.run_dir, total_steps=total)
    assert resumed.env_steps == straight.env_steps == total
    got, want = load_checkpoint(resumed.run_dir).state, load_checkpoint(straight.run_dir).state
    assert_states_equal(got["algorithm"], want["algorithm"])
    assert len(got["algorithm"]["sampler"]["runners"]) == 2
