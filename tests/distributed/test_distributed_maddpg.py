"""Distributed MADDPG: config checks, the collector's rows and the learner's updates against
MADDPG's own, the parameter server's last-writer-wins, Ray smoke runs with checkpoint and
resume, recovery from killed actors, and a fixed-seed learning test."""

import dataclasses
import math

import pytest
import torch
from in_process_ray import assert_ray_run_is_the_in_process_run
from random_policy import RandomPolicy
from state_helpers import assert_states_equal

import shoal
from shoal.algos.multi_agent.distributed_maddpg import (
    NETWORKS,
    Collector,
    DistributedMADDPG,
    DistributedMADDPGConfig,
    LearnerWorker,
    Trained,
    network_state,
)
from shoal.algos.multi_agent.maddpg import MADDPG, MADDPGConfig
from shoal.collect.evaluate import evaluate
from shoal.config import EnvConfig
from shoal.core.errors import ConfigError
from shoal.train.checkpoint import load_checkpoint

ITERATION = 8  # 1 collector x 4 envs x 2 steps
LEARNING_STEPS = 30_000


def small(**extra):
    overrides = {
        "env.num_envs": 4,
        "maddpg.rollout_steps": 2,
        "maddpg.replay.gradient_steps": 2,
        "maddpg.replay.batch_size": 16,
        "maddpg.replay.learning_starts": ITERATION,
        "maddpg.replay.buffer_size": 400,
        "maddpg.model.hidden": (16,),
        "sync_every": 2,
        "run.eval_every_steps": 0,
        "run.checkpoint_every_steps": 0,
        "run.console": False,
        "run.tensorboard": False,
    }
    overrides.update(extra)
    return overrides


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"num_learners": 0}, r"DistributedMADDPGConfig\.num_learners"),
        ({"sync_every": 0}, r"DistributedMADDPGConfig\.sync_every"),
        ({"run.runners": 0}, r"DistributedMADDPGConfig\.run .*collectors"),
        ({"maddpg.critic_input": "everything"}, r"MADDPGConfig\.critic_input"),
        ({"maddpg.gumbel_temperature": 0.0}, r"MADDPGConfig\.gumbel_temperature"),
        ({"maddpg.env.num_envs": 2}, r"DistributedMADDPGConfig\.maddpg .*top level"),
        ({"maddpg.run.seed": 3}, r"DistributedMADDPGConfig\.maddpg .*top level"),
        # MADDPG's own checks see the real env: 64 envs x (n_step + 2) rows > 100.
        ({"env.num_envs": 64, "maddpg.replay.buffer_size": 100}, r"ReplayConfig\.buffer_size"),
    ],
)
def test_bad_config_values_are_refused(overrides, match):
    with pytest.raises(ConfigError, match=match):
        shoal.build_config("maddpg-distributed", **overrides)


def test_config_composes_maddpg():
    config = shoal.build_config("maddpg-distributed", seed=5, **small())
    assert isinstance(config, DistributedMADDPGConfig) and config.run.runners == 1
    inner = config.learner_config()
    assert isinstance(inner, MADDPGConfig)
    assert inner.run.seed == 5 and inner.env == config.env and inner.replay.batch_size == 16
    assert shoal.registry.algorithm_for_config(config).name == "maddpg-distributed"


def test_tuned_example_builds():
    config = shoal.registry.find_tuned("maddpg-distributed-spread").build_config()
    assert config.run.runners == 1 and config.num_learners == 2
    assert config.maddpg.replay.prioritized == "rank" and config.env.num_envs == 16
    per = shoal.registry.find_tuned("maddpg-per-spread").build_config()
    # maddpg-per-spread's MADDPG, its replay ratio in four times larger Ray calls.
    assert config.maddpg.rollout_steps == 4 * per.rollout_steps
    assert config.maddpg.replay.gradient_steps == 4 * per.replay.gradient_steps
    replay = dataclasses.replace(per.replay, gradient_steps=2)
    changes = {"run": per.run, "rollout_steps": 2, "replay": replay}
    assert dataclasses.replace(config.learner_config(), **changes) == per


@pytest.mark.parametrize("prioritized", ["none", "rank"])
def test_one_learner_updates_as_maddpg(prioritized):
    """In-process, no Ray: a collector's steps are the rows MADDPG stores, and a learner
    given MADDPG's weights and the same batches ends each call with MADDPG's weights,
    replay priorities and optimizer state (same seeds, same Gumbel draws)."""
    config = shoal.build_config(
        "maddpg-distributed",
        seed=2,
        **small(**{"maddpg.replay.prioritized": prioritized, "num_learners": 1}),
    )
    inner = config.learner_config()
    torch.manual_seed(0)
    reference = MADDPG(inner)
    collector = Collector(inner, 0)
    worker = LearnerWorker(inner, 0, sync_every=inner.replay.gradient_steps)
    learned = 0
    for k in range(5):
        reference.learner.set_random_actions(reference.env_steps < inner.replay.learning_starts)
        weights = reference.learner.get_weights()
        reference.runner.set_weights(weights)
        torch.manual_seed(10 + k)
        reference._collect()
        torch.manual_seed(10 + k)
        worker.add(collector.collect(weights))
        assert_states_equal(worker.replay.state_dict(), reference.replay.state_dict())
        if reference.env_steps > inner.replay.learning_starts:
            master = network_state(reference.learner)
            torch.manual_seed(100 + k)
            reference._learn()
            torch.manual_seed(100 + k)
            result = worker.train(master, version=k, env_steps=reference.env_steps)
            assert result.updates == inner.replay.gradient_steps and result.version == k
            assert_states_equal(result.networks, network_state(reference.learner))
            assert_states_equal(worker.state_dict(), reference.learner.state_dict())
            assert_states_equal(worker.replay.state_dict(), reference.replay.state_dict())
            learned += 1
    assert learned == 4 and reference.learner.grad_steps == 8
    reference.close()
    collector.close()


def test_learner_waits_for_learning_starts():
    config = shoal.build_config(
        "maddpg-distributed", **small(**{"maddpg.replay.learning_starts": 16})
    )
    inner = config.learner_config()
    collector, worker = Collector(inner, 0), LearnerWorker(inner, 1, sync_every=3)
    weights = collector.acting.state_dict()
    worker.add(collector.collect(weights))
    master = network_state(worker.learner)
    assert worker.train(master, 0, ITERATION) == Trained(None, {}, 0, 0)
    worker.add(collector.collect(weights))
    result = worker.train(master, 0, 2 * ITERATION)
    assert result.updates == 3 and worker.learner.grad_steps == 3
    assert math.isfinite(result.metrics["loss/critic"])
    collector.close()


def _scripted(results):
    yield from results


def test_parameter_server_last_writer_wins(in_process_ray):
    """Two learners start from master version 0; the master becomes each result as it
    arrives, so the second one overwrites the first (lag 1), and the collectors are sent
    the writer's actors."""
    config = shoal.build_config("maddpg-distributed", **small())
    algo = DistributedMADDPG(config)
    try:
        inner = config.learner_config()
        collector = Collector(inner, 0)
        workers = [LearnerWorker(inner, j, sync_every=2) for j in range(2)]
        batch = collector.collect(collector.acting.state_dict())
        for worker in workers:
            worker.add(batch)
        start = algo.master
        results = [workers[j].train(start, algo.version, ITERATION) for j in (0, 1)]
        algo._stream = _scripted([(0, results[0]), (1, results[1])])
        algo.owed = 4
        trained, lags = algo._learn()
        assert lags == [0, 1] and algo.version == 2 and algo.updates == 4 and algo.owed == 0
        assert [t.version for t in trained] == [0, 0]
        assert_states_equal(algo.master, results[1].networks)
        assert not torch.equal(
            results[0].networks["actor"]["actors.agent.out_weight"],
            results[1].networks["actor"]["actors.agent.out_weight"],
        )  # different replay seeds and Gumbel draws: the first learner's work is overwritten
        for name, value in algo.actor.state_dict().items():
            if name != "random_actions":
                assert torch.equal(value, results[1].networks["actor"][name]), name
        collector.close()
    finally:
        algo._stream = None
        algo.close()


VARIANTS = {
    "discrete_rank_per": {"maddpg.replay.prioritized": "rank"},
    "continuous_nstep": {"env.kwargs": {"continuous": True}, "maddpg.replay.n_step": 3},
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_smoke_checkpoint_and_resume(variant, in_process_ray, tmp_path):
    seen = []
    result = shoal.train(
        "maddpg-distributed",
        seed=1,
        run_dir=str(tmp_path / "run"),
        total_steps=16 * ITERATION,
        on_iteration=lambda step, metrics: seen.append(metrics),
        **small(**VARIANTS[variant]),
    )
    assert result.env_steps == 16 * ITERATION and len(seen) == 16
    learned = [m for m in seen if "loss/critic" in m]
    assert learned and seen[-1]["train/grad_steps"] > 0
    assert seen[-1]["train/master_version"] == sum(m["train/learner_results"] for m in seen)
    assert all(math.isfinite(m["loss/critic"]) and math.isfinite(m["loss/actor"]) for m in learned)
    assert all(m["train/learner_lag"] >= 0 for m in learned)
    assert any("episode/return/agent_0" in m for m in seen)  # after 25 steps of spread

    saved = load_checkpoint(result.run_dir).state["algorithm"]
    assert set(NETWORKS) | {"optimizer", "grad_steps"} <= set(saved["learner"])
    assert saved["counters"]["version"] == seen[-1]["train/master_version"]
    master_actor = saved["learner"]["actor"]
    for name, value in saved["policy"]["model"].items():  # the one group's actors, deployable
        if name != "random_actions":
            assert torch.equal(value, master_actor[f"actors.agent.{name}"]), name
    config = shoal.load(result.run_dir).config
    env = shoal.make_env(config.env, num_envs=2)
    actions = shoal.load(result.run_dir).act(env.reset(seed=0))
    assert actions.shape[0] == 6  # 2 envs x 3 agents
    env.close()

    more = []
    resumed = shoal.train(
        resume=result.run_dir,
        total_steps=20 * ITERATION,
        on_iteration=lambda step, metrics: more.append(metrics),
    )
    assert resumed.env_steps == 20 * ITERATION and resumed.iterations == 20
    assert more[0]["train/grad_steps"] >= seen[-1]["train/grad_steps"]
    state = load_checkpoint(resumed.run_dir).state["algorithm"]
    assert state["counters"]["version"] >= saved["counters"]["version"]


def test_results_in_turn_make_the_ray_run_the_in_process_one(ray_session, tmp_path, monkeypatch):
    """Learner results applied in turn: the learners train at once on Ray, yet the run ends
    in the state (master networks, collectors' envs), bit for bit, and logs the metrics of
    the same seed's run with its workers called one after another in this process."""
    _, rows = assert_ray_run_is_the_in_process_run(
        tmp_path, monkeypatch, "maddpg-distributed", 12 * ITERATION, seed=4,
        **small(results_in_turn=True),
    )  # fmt: skip
    assert rows[-1]["train/master_version"] > 4


def test_killed_collector_and_learner_are_restarted(ray_session):
    config = shoal.build_config("maddpg-distributed", seed=3, **small())
    algo = DistributedMADDPG(config)
    try:
        for _ in range(4):
            algo.train_iteration()
        version, updates = algo.version, algo.updates
        assert version > 0
        algo.collectors.kill(0)
        algo.learners.kill(1)
        seen = [algo.train_iteration() for _ in range(8)]
        assert algo.collectors.restarts >= 1 and seen[-1]["train/collector_restarts"] >= 1
        assert algo.learners.restarts >= 1 and seen[-1]["train/learner_restarts"] >= 1
        assert algo.env_steps == 12 * ITERATION and algo.iteration == 12
        assert algo.version > version and algo.updates > updates
        assert all(math.isfinite(m["loss/critic"]) for m in seen if "loss/critic" in m)
        # The restarted learner refilled its replay and trains again.
        assert algo.learners.call_one(1, "ready")
    finally:
        algo.close()


MARGIN = 3.5
"""Required gain in mean per-agent return over uniformly random actions after 30k env steps,
on the first episode of 64 evaluation envs (random actions: -25.2 here). With learner
results applied in turn the run is the same every time: seed 0 gains 5.8 (-19.4). As they
arrive (the default), seeds 0-2 gained 4.7-6.4, and one run 2.3: which learner's result
is applied next is then timing. MADDPG's own test asks for 5.0 from its deterministic runs.
About 150 s on two cores beside the other tests: in the slow tier."""


@pytest.mark.slow
@pytest.mark.learning
def test_beats_random_on_spread(ray_session, tmp_path):
    env = shoal.make_env(EnvConfig(id="shoal/spread-v0", num_envs=64))
    random_return = evaluate(RandomPolicy(5, seed=1), env, seed=2024)["eval/return"]
    result = shoal.train(
        tuned="maddpg-distributed-spread",
        seed=0,
        run_dir=str(tmp_path / "run"),
        total_steps=LEARNING_STEPS,
        **{"results_in_turn": True, "run.eval_every_steps": 0,
           "run.checkpoint_every_steps": 0, "run.console": False, "run.tensorboard": False},
    )  # fmt: skip
    trained = evaluate(shoal.load(result.run_dir), env, seed=2024)["eval/return"]
    env.close()
    print(f"maddpg-distributed: random {random_return:.2f}, trained {trained:.2f}")
    assert trained >= random_return + MARGIN, (trained, random_return)
