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


def run(algo, iterations, kill_at=None, save_at=None):
    """``iterations`` iterations; rank 1 killed before iteration ``kill_at``; the state (as a
    checkpoint holds it) and the torch generator taken after ``save_at`` of them."""
    saved = None
    try:
        for i in range(iterations):
            if i == kill_at:
                algo.learner.kill(1)
            metrics = algo.train_iteration()
            if i + 1 == save_at:
                # as a checkpoint holds them: copies (the state holds views of live tensors)
                saved = copy.deepcopy(algo.state_dict()), rng_state()
        return weights(algo), metrics, saved
    finally:
        algo.close()


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


def test_an_a2c_learner_group_resumes_exactly():
    expected, _, (state, rng) = run(build("a2c"), 4, save_at=2)
    resumed = build("a2c")
    assert resumed.load_state_dict(state)
    set_rng_state(rng)
    assert_same(run(resumed, 2)[0], expected)


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
