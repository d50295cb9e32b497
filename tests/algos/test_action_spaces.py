"""MultiDiscrete, MultiBinary, Tuple and Dict actions through the on-policy family
(`tests/action_env.py`: a one-step bandit that pays for each part of the action)."""

import numpy as np
import pytest

import shoal
from tests.action_env import BEST

ENV = "tests.action_env:Actions-v0"
QUIET = {"run.console": False, "run.tensorboard": False, "run.checkpoint_every_steps": 0}
KINDS = ["multidiscrete", "multibinary", "tuple", "dict"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("algo", ["ppo", "a2c", "pg", "trpo", "impala", "appo", "acktr"])
def test_each_on_policy_algorithm_trains_on_each_kind(algo, kind, tmp_path):
    result = shoal.train(
        algo,
        env=ENV,
        seed=0,
        total_steps=512,
        run_dir=str(tmp_path / "run"),
        **{
            "env.kwargs": {"kind": kind},
            "env.num_envs": 4,
            "run.eval_every_steps": 512,
            "run.eval_episodes": 4,
            **QUIET,
        },
    )
    assert np.isfinite(result.eval_return)
    policy = shoal.load(result.run_dir)
    action = policy.act(np.eye(3, dtype=np.float32)[0])
    space = policy.action_space
    if kind in ("tuple", "dict"):
        assert space.original.contains(_typed(kind, action)), action
    else:
        assert space.contains(np.asarray(action, space.dtype)), action


def _typed(kind, action):
    if kind == "tuple":
        return (int(action[0]), np.asarray(action[1], np.float32))
    return {"pick": int(action["pick"]), "flags": np.asarray(action["flags"], np.int8)}


@pytest.mark.parametrize("kind", KINDS)
def test_ppo_learns_every_part_of_the_action(kind, tmp_path):
    result = shoal.train(
        "ppo",
        env=ENV,
        seed=0,
        total_steps=20_000,
        run_dir=str(tmp_path / "run"),
        **{
            "env.kwargs": {"kind": kind},
            "run.eval_every_steps": 20_000,
            "run.eval_episodes": 20,
            **QUIET,
        },
    )
    # Random actions earn about a third of the best; each part must be learned to get near it.
    assert result.eval_return >= BEST[kind] - 0.25


def test_value_based_and_off_policy_learners_name_what_works(tmp_path):
    from shoal.core.errors import UnsupportedSpaceError

    with pytest.raises(UnsupportedSpaceError, match="PPO"):
        shoal.train(
            "dqn", env=ENV, run_dir=str(tmp_path / "run"), **{"env.kwargs": {"kind": "tuple"}}
        )


def train_on_dict_actions(algo, tmp_path):
    result = shoal.train(algo, env=ENV, seed=0, total_steps=256, run_dir=str(tmp_path / "dict"),
                         **{"env.kwargs": {"kind": "dict"}, "env.num_envs": 4,
                            "run.eval_every_steps": 256, "run.eval_episodes": 4,
                            **QUIET})  # fmt: skip
    assert np.isfinite(result.eval_return)


def test_a3c_trains_on_composite_actions(in_process_ray, tmp_path):
    """A3C (its gradient workers on Ray's stand-in in this process) on Dict actions (of
    Discrete and MultiDiscrete parts), as `shoal list` states; its learner is A2C's, tested
    on every kind above."""
    train_on_dict_actions("a3c", tmp_path)


def test_ddppo_trains_on_composite_actions(forked_learners, tmp_path):
    """DD-PPO (workers whose gradients meet in an all-reduce; forked from the test here,
    tests/forked_ray.py) on Dict actions; its learner is PPO's, tested on every kind above."""
    train_on_dict_actions("ddppo", tmp_path)
