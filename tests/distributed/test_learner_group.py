"""Learner groups on Ray (``run.learners`` > 1, `shoal.algos.cores.learner_group`): Ray runners
and learners train together (PPO; IMPALA, its learners taking env columns; SAC, a replay
learner's group filled by a runner), checkpoint, resume and deploy. A learner killed on a Ray
cluster, and a lost node, are tests/test_cluster_faults.py's; the groups' own logic (restarts,
relearning, resumes) is tested on ranks forked from the test
(tests/algos/test_learner_groups.py), and their updates against one learner's
(tests/algos/test_learner_group_step.py, test_replay_group_step.py)."""

import math

import pytest
from learner_group_runs import PPO, QUIET, SMALL

import shoal
from shoal.collect.evaluate import evaluate

pytestmark = pytest.mark.usefixtures("ray_session")


RUNNERS_AND_LEARNERS = {
    "ppo": ("CartPole-v1", 128, {**SMALL, **PPO}),
    "impala": ("CartPole-v1", 128, {
        "env.num_envs": 4, "num_steps": 16, "model.hidden": (16,), "run.learners": 2,
        "run.seed": 3,
    }),
    "sac": ("Pendulum-v1", 64, {
        "env.num_envs": 2, "rollout_steps": 8, "model.hidden": (16,), "run.learners": 2,
        "run.seed": 3, "replay.batch_size": 16, "replay.learning_starts": 32,
    }),
}  # fmt: skip


@pytest.mark.parametrize("name", list(RUNNERS_AND_LEARNERS))
def test_runners_and_learners_train_together_and_resume_from_a_checkpoint(name, tmp_path):
    """One Ray runner samples and two learners learn, through the training loop: checkpoints,
    a resume that continues the run, the deployed policy (PPO; IMPALA, whose learners take
    env columns of the batches arriving from the runner; SAC, a replay learner's group with
    a runner filling its replay)."""
    env_id, every, small = RUNNERS_AND_LEARNERS[name]
    settings = {**small, **QUIET, "env.id": env_id, "run.runners": 1,
                "run.checkpoint_every_steps": every}  # fmt: skip
    result = shoal.train(name, run_dir=str(tmp_path / "r"), total_steps=2 * every, **settings)
    assert result.env_steps == 2 * every and result.checkpoint is not None
    more = shoal.train(
        name, run_dir=str(tmp_path / "r"), resume=result.checkpoint, total_steps=3 * every,
        **settings,
    )  # fmt: skip
    assert more.env_steps == 3 * every
    policy = shoal.load(more.run_dir)
    env = shoal.make_env(env_id, num_envs=2)
    metrics = evaluate(policy, env, seed=0)
    env.close()
    assert math.isfinite(metrics["eval/return"]) and metrics["eval/length"] > 0
