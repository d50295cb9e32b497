"""Learner groups (``run.learners`` > 1) with their ranks forked from the test
(tests/forked_ray.py) instead of started as Ray actors: the groups' logic as it runs on Ray,
without an actor's start-up. PPO's group loses a rank and takes the update again from the
synchronized state; a replay learner's group loses one between two synchronizations and
relearns the batches since; A2C's, REINFORCE's, ACER's, APPO's, R2D2's, QMIX's, MADDPG's
and an offline group resume exactly; CQL, PPO and QMIX learn with two learners. (On Ray itself:
tests/distributed/test_learner_group.py and tests/test_cluster_faults.py.)"""

import numpy as np
import pytest
import torch
from learner_group_runs import CQL_GROUP, assert_same, bandit, build, kill_during, run
from state_helpers import assert_states_equal, metric_rows

import shoal
from shoal.collect.evaluate import evaluate
from shoal.core.seeding import set_rng_state
from shoal.train.checkpoint import load_checkpoint

pytestmark = pytest.mark.usefixtures("forked_learners")


def test_a_killed_learner_and_a_resume_end_where_the_undisturbed_run_does():
    """Rank 1 dies before the third update: the group is rebuilt from the weights, optimizer
    state and generator state synchronized after the second, and runs the third update again.
    A run resumed from the state after the second update goes on exactly as well. Both end
    with the weights of the run nobody disturbed."""
    clean, clean_metrics, (state, rng) = run(build("ppo"), 4, save_at=2)
    killed, killed_metrics, _ = run(build("ppo"), 4, kill_at=2)
    assert_same(clean, killed)
    assert "perf/learner_restarts" not in clean_metrics
    assert killed_metrics["perf/learner_restarts"] == 1
    resumed = build("ppo")
    assert resumed.load_state_dict(state)
    set_rng_state(rng)
    assert_same(run(resumed, 2)[0], clean)


def test_a_replay_group_rebuilt_mid_iteration_and_a_resume_end_where_the_undisturbed_run_does():
    """DQN with prioritized replay and two learners: rank 1 dies before the 11th update, in
    the middle of the third iteration, with two updates since the copy was synchronized; the
    rebuilt group learns those again and goes on. A run resumed from the state after the
    second iteration goes on exactly as well. Both end with the undisturbed run's weights."""
    clean, clean_metrics, (state, rng) = run(build("dqn"), 5, save_at=2)
    disturbed = build("dqn")
    kill_during(disturbed, 11)
    killed, killed_metrics, _ = run(disturbed, 5)
    assert_same(clean, killed)
    assert "perf/learner_restarts" not in clean_metrics
    assert killed_metrics["perf/learner_restarts"] == 1
    assert clean_metrics["train/grad_steps"] == 4 * 4  # learning from the second iteration
    resumed = build("dqn")
    resumed.load_state_dict(state)
    set_rng_state(rng)
    assert_same(run(resumed, 3)[0], clean)


@pytest.mark.parametrize(
    "name",
    [
        "a2c",
        "pg",
        "acer",
        "appo",
        "r2d2",
        "qmix",
        "maddpg",
        "ctedd",
        "trpo",
        "acktr",
        "alphazero",
        "muzero",
    ],  # fmt: skip
)
def test_learner_groups_resume_exactly(name):
    """A2C's group; REINFORCE's, whose batches of complete episodes vary in size; ACER's,
    whose learners split the env columns of on-policy and replayed segments; APPO's,
    whose sampler thread acts one update behind the group; R2D2's, whose learners split each
    batch of sequences and whose epsilon reaches them with it; QMIX's, whose learners split
    each batch of episodes and whose acting copy is synchronized every iteration; MADDPG's,
    whose learners split each batch of joint steps (discrete actions: Gumbel noise); CTEDD's,
    whose learners also take each exploration update whole; TRPO's, whose learners all-reduce
    every Fisher-vector product; ACKTR's, whose learners all-reduce the Kronecker factors;
    AlphaZero's and MuZero's, whose learners split each batch of positions or unrolls while
    self-play goes on in the driver's process."""
    expected, _, (state, rng) = run(build(name), 4, save_at=2)
    resumed = build(name)
    assert resumed.load_state_dict(state)
    set_rng_state(rng)
    assert_same(run(resumed, 2)[0], expected)


def test_an_offline_group_resumes_exactly(tmp_path):
    """CQL from a dataset with two learners: a run checkpointed after 40 updates and resumed
    to 80 ends with the state and metrics of the run that went to 80 straight."""
    data = bandit(tmp_path / "bandit", size=300)
    settings = {**CQL_GROUP, "run.checkpoint_every_steps": 40}
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    part = shoal.train("cql", dataset=data, seed=3, total_steps=40, run_dir=a, quiet=True,
                       **settings)  # fmt: skip
    resumed = shoal.train(resume=part.run_dir, total_steps=80, quiet=True)
    straight = shoal.train("cql", dataset=data, seed=3, total_steps=80, run_dir=b, quiet=True,
                           **settings)  # fmt: skip
    got = load_checkpoint(resumed.run_dir).state
    assert_states_equal(got["algorithm"], load_checkpoint(straight.run_dir).state["algorithm"])
    assert metric_rows(resumed.run_dir) == metric_rows(straight.run_dir)


@pytest.mark.learning
def test_cql_learns_the_rewarded_action_with_two_learners(tmp_path):
    """The offline bandit of tests/algos/test_offline.py with two learners splitting every
    batch: CQL picks the rewarded action from random play's data (a random policy is right
    half the time)."""
    result = shoal.train("cql", dataset=bandit(tmp_path / "bandit"), total_steps=600,
                         run_dir=str(tmp_path / "r"), quiet=True, **CQL_GROUP)  # fmt: skip
    test = np.random.default_rng(1).uniform(-1, 1, (500, 4)).astype(np.float32)
    chosen = shoal.load(result.run_dir).act(test)
    assert (chosen == (test[:, 0] > 0)).mean() >= 0.9


@pytest.mark.learning
def test_ppo_learns_cartpole_with_two_learners(tmp_path):
    """Two learners split every minibatch of the tuned CartPole settings: the policy balances
    the pole far longer than a random one (about 22 steps)."""
    result = shoal.train(
        tuned="ppo-cartpole",
        run_dir=str(tmp_path / "r"),
        **{"run.console": False, "run.tensorboard": False, "run.checkpoint_every_steps": 0},
        **{"run.learners": 2, "run.seed": 1},
    )
    assert result.solved, result
    policy = shoal.load(result.run_dir)
    env = shoal.make_env("CartPole-v1", num_envs=10)
    metrics = evaluate(policy, env, seed=2024)
    env.close()
    assert metrics["eval/return"] >= 400, metrics


@pytest.mark.learning
def test_qmix_learns_the_two_step_game_with_two_learners(tmp_path):
    """The two-step game of tests/algos/test_qmix_learning.py with two learners splitting
    each batch's episodes: QMIX earns the optimal 8 on each of three seeds (an untrained
    greedy team reaches it by chance about one time in eight)."""
    from test_qmix_learning import TWO_STEP  # noqa: PLC0415  (the single learner's settings)

    returns = [shoal.train("qmix", run_dir=str(tmp_path / f"s{seed}"), total_steps=12288,
                           seed=seed, **TWO_STEP, **{"run.learners": 2}).eval_return
               for seed in range(3)]  # fmt: skip
    assert returns == [8.0, 8.0, 8.0], returns


def test_ctedd_with_two_learners_trains_as_one_learner_does():
    """CTEDD's group against one learner, same seed, four iterations: stage 1's updates split
    among the learners, the exploration updates each learner takes whole (a call), and
    the distillation from the synchronized copy end where the single learner does (to float
    rounding, compounded over 6 updates, 3 exploration updates and 2 distillation rounds)."""
    group, group_metrics, _ = run(build("ctedd"), 4)
    single, single_metrics, _ = run(build("ctedd", **{"run.learners": 1}), 4)
    assert group.keys() == single.keys()
    for key, tensor in single.items():
        torch.testing.assert_close(group[key], tensor, rtol=1e-4, atol=1e-5, msg=key)
    assert "loss/exploration" in group_metrics and "distill/rows" in single_metrics
    for key, value in single_metrics.items():
        assert group_metrics[key] == pytest.approx(value, rel=1e-3, abs=1e-5), key
