"""Learner groups on Ray (``run.learners`` > 1, `shoal.algos.cores.learner_group`): a killed
learner restarts the group from its last synchronized state with nothing lost, a group resumes
exactly, runners and learners train together, and PPO learns with two learners.
(tests/algos/test_learner_group_step.py: two learners take the update of one.)"""

import copy

import pytest
import torch

import shoal
from shoal.collect.evaluate import evaluate
from shoal.core.seeding import rng_state, set_rng_state
from shoal.registry import ALGORITHMS

pytestmark = pytest.mark.usefixtures("ray_session")

SMALL = {
    "env.id": "CartPole-v1",
    "env.num_envs": 4,
    "num_steps": 16,
    "model.hidden": (16,),
    "run.learners": 2,
    "run.seed": 3,
}
PPO = {"minibatch_size": 32, "num_epochs": 2}
QUIET = {
    "run.eval_every_steps": 0,
    "run.console": False,
    "run.tensorboard": False,
}


def build(name="ppo", **settings):
    """The algorithm seeded as the training loop seeds it."""
    spec = ALGORITHMS[name]
    extra = PPO if name == "ppo" else {}
    config = spec.default_config(**{**SMALL, **extra, **settings})
    torch.manual_seed(11)
    return spec.algorithm_cls(config)


def weights(algo):
    return {k: v.clone() for k, v in algo.learner.get_weights().items()}


def assert_same(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_a_killed_learner_restarts_the_group_and_nothing_is_lost():
    """Rank 1 dies before the third update: the group is rebuilt from the weights, optimizer
    state and generator state synchronized after the second, and runs the third update again:
    the run ends with the weights of a run nobody killed."""
    runs = []
    for kill in (False, True):
        algo = build("ppo")
        try:
            for i in range(4):
                if kill and i == 2:
                    algo.learner.kill(1)
                metrics = algo.train_iteration()
            runs.append((weights(algo), metrics))
        finally:
            algo.close()
    (clean, clean_metrics), (killed, killed_metrics) = runs
    assert_same(clean, killed)
    assert "perf/learner_restarts" not in clean_metrics
    assert killed_metrics["perf/learner_restarts"] == 1


@pytest.mark.parametrize("name", ["ppo", "a2c"])
def test_a_learner_group_resumes_exactly(name):
    first = build(name)
    try:
        for _ in range(2):
            first.train_iteration()
        # as a checkpoint holds them: copies (the state holds views of the live tensors)
        state, rng = copy.deepcopy(first.state_dict()), rng_state()
        for _ in range(2):
            first.train_iteration()
        expected = weights(first)
    finally:
        first.close()
    resumed = build(name)
    try:
        assert resumed.load_state_dict(state)
        set_rng_state(rng)
        for _ in range(2):
            resumed.train_iteration()
        assert_same(weights(resumed), expected)
    finally:
        resumed.close()


def test_runners_and_learners_train_together_and_resume_from_a_checkpoint(tmp_path):
    """One Ray runner samples and two learners learn, through the training loop: checkpoints,
    a resume that continues the run, the deployed policy."""
    settings = {**SMALL, **PPO, **QUIET, "run.runners": 1, "run.checkpoint_every_steps": 128}
    result = shoal.train("ppo", run_dir=str(tmp_path / "r"), total_steps=256, **settings)
    assert result.env_steps == 256 and result.checkpoint is not None
    more = shoal.train(
        "ppo", run_dir=str(tmp_path / "r"), resume=result.checkpoint, total_steps=384, **settings
    )
    assert more.env_steps == 384
    policy = shoal.load(more.run_dir)
    env = shoal.make_env("CartPole-v1", num_envs=2)
    metrics = evaluate(policy, env, seed=0)
    env.close()
    assert metrics["eval/return"] > 0


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
