"""MADDPG and QMIX/VDN/IQL on Ray runners (`shoal.collect.multi_agent_ray`): one synchronous
runner is the in-process run (QMIX, whose exploration draws from a generator of its own),
several store their envs side by side and keep the updates per env step, a run resumes
exactly (all on Ray's stand-in in this process), and a killed runner is replaced with the
episodes it lost cut (on Ray)."""

import copy

import numpy as np
import pytest
import torch
from state_helpers import assert_states_equal

from shoal.core.seeding import rng_state, set_rng_state
from shoal.registry import ALGORITHMS

SETTINGS = {
    "maddpg": {
        "env.id": "shoal/spread-v0",
        "env.num_envs": 2,
        "rollout_steps": 2,
        "replay.gradient_steps": 2,
        "replay.batch_size": 16,
        "replay.learning_starts": 8,
        "replay.buffer_size": 400,
        "model.hidden": (16,),
    },
    "qmix": {
        "env.num_envs": 4,
        "rollout_steps": 2,
        "replay.batch_size": 4,
        "replay.learning_starts": 4,
        "replay.buffer_size": 64,
        "target_update_every": 3,
        "exploration_steps": 64,
        "model.hidden": (8,),
        "rnn_hidden": 8,
        "mixing_embed_dim": 4,
    },
}
SETTINGS["ctedd"] = {
    **SETTINGS["maddpg"],
    "env.id": "shoal/cn-v1-v0",
    "global_hidden": (8,),
    "local_hidden": (8,),
    "distill_every": 16,
    "distill_batch_size": 8,
    "distill_repeats": 2,
}
SETTINGS["vdn"] = {k: v for k, v in SETTINGS["qmix"].items() if k != "mixing_embed_dim"}


def build(name, **settings):
    """The algorithm seeded as the training loop seeds it."""
    spec = ALGORITHMS[name]
    config = spec.default_config(**{**SETTINGS[name], "run.seed": 5, **settings})
    torch.manual_seed(11)
    return spec.algorithm_cls(config)


def train(algo, iterations):
    return [algo.train_iteration() for _ in range(iterations)]


def learned(algo):
    """What the run learned and stored: the learner's and the replay's state (and CTEDD's
    distilled local policies)."""
    state = {"learner": algo.learner.state_dict(), "replay": algo.replay.state_dict()}
    if hasattr(algo, "students"):
        state["students"] = {m: s.state_dict() for m, s in algo.students.items()}
    return copy.deepcopy(state)


@pytest.mark.parametrize("name", ["qmix", "vdn"])
def test_one_synchronous_runner_is_the_in_process_run(name, in_process_ray):
    """Runner 0 seeds its env, its exploration and the fixed groups as the in-process runner
    does, and acts with the weights the learner has when it samples: the same run."""
    runs = []
    for runners in (0, 1):
        algo = build(name, **{"run.runners": runners})
        try:
            metrics = train(algo, 10)
            runs.append((learned(algo), algo.env_steps, metrics))
        finally:
            algo.close()
    (local, local_steps, local_metrics), (ray, ray_steps, ray_metrics) = runs
    assert local_steps == ray_steps == 10 * 2 * 4
    assert local["learner"]["grad_steps"] > 0
    assert_states_equal(local, ray)
    assert local_metrics == ray_metrics


@pytest.mark.parametrize("name", ["maddpg", "qmix", "ctedd"])
def test_runners_store_their_envs_side_by_side_and_keep_updates_per_env_step(name, in_process_ray):
    algo = build(name, **{"run.runners": 2})
    try:
        assert algo.runner.num_envs == 2 * SETTINGS[name]["env.num_envs"]
        metrics = train(algo, 6)
        assert algo.env_steps == 6 * 2 * algo.runner.num_envs
        if name in ("maddpg", "ctedd"):
            assert algo.replay.num_envs == 4
            # gradient_steps 2 per rollout of env.num_envs envs: 4 per iteration of 2
            # runners, from the first iteration past learning_starts (8 env steps: the second)
            assert metrics[-1]["train/grad_steps"] == 4 * 5
        else:
            assert algo.builder.num_envs == 8
            # two-step episodes, each followed by its autoreset step: 4 per env in 12 steps
            assert algo.replay.episodes_added == 4 * 8
            assert metrics[-1]["train/grad_steps"] > 0
    finally:
        algo.close()


@pytest.mark.parametrize("name", ["maddpg", "qmix", "ctedd"])
def test_a_run_on_runners_resumes_exactly(name, in_process_ray):
    """The runners' envs, exploration and torch generators go into the checkpoint (CTEDD:
    its exploration update takes the states and samples every runner kept)."""
    settings = {"run.runners": 2, "replay.save": True}
    first = build(name, **settings)
    try:
        train(first, 3)
        state, rng = copy.deepcopy(first.state_dict()), rng_state()
        train(first, 3)
        expected = learned(first)
    finally:
        first.close()
    resumed = build(name, **settings)
    try:
        assert resumed.load_state_dict(state)  # mid-episode
        set_rng_state(rng)
        train(resumed, 3)
        assert_states_equal(learned(resumed), expected)
    finally:
        resumed.close()


def test_a_killed_maddpg_runner_is_replaced_and_the_episodes_it_lost_are_cut(ray_session):
    algo = build("maddpg", **{"run.runners": 2, "replay.n_step": 3})
    try:
        train(algo, 3)
        replay = algo.replay
        newest = (replay._rows_written - 1) % replay.rows
        before = (newest - 1) % replay.rows
        assert replay.valid[newest].all()  # spread's episodes last 25 steps
        algo.runner.kill_runner(1)
        train(algo, 1)
        assert algo.runner.restarts == 1
        # Runner 1's envs (2 and 3) lost what followed their newest stored step: it became
        # the autoreset row of an episode truncated one step earlier; runner 0's are kept.
        assert not replay.valid[newest, 2:].any() and replay.truncated[before, 2:].all()
        assert replay.valid[newest, :2].all() and not replay.truncated[before, :2].any()
        metrics = train(algo, 2)
        assert np.isfinite(metrics[-1]["loss/critic"]) and metrics[-1]["train/grad_steps"] > 0
    finally:
        algo.close()


def test_a_killed_qmix_runner_is_replaced_and_its_unfinished_episodes_dropped(ray_session):
    """Two-step episodes, each followed by its autoreset step, one vector step per
    iteration. The killed runner's envs begin again from their new reset, so no episode of
    theirs mixes steps of the old actor's episode and the new one's."""
    algo = build("qmix", **{"run.runners": 2, "rollout_steps": 1, "env.num_envs": 2})
    try:
        train(algo, 4)  # step, step (episode stored), autoreset, step
        assert algo.replay.episodes_added == 4 and (algo.builder.t == 1).all()
        algo.runner.kill_runner(1)
        train(algo, 1)
        assert algo.runner.restarts == 1
        # Runner 0's envs finished their second episodes; runner 1's began new ones (from
        # the reset of the rebuilt runner) and are one step into them, not two.
        assert algo.replay.episodes_added == 6
        np.testing.assert_array_equal(algo.builder.t, [0, 0, 1, 1])
        train(algo, 3)  # runner 0: autoreset, step, step; runner 1: step, autoreset, step
        assert algo.replay.episodes_added == 6 + 2 + 2
        np.testing.assert_array_equal(algo.builder.t, [0, 0, 1, 1])
    finally:
        algo.close()
