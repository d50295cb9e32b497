"""Gymnasium wrappers named in the config (``env.wrappers``, ``env.frame_stack``)."""

import sys

import numpy as np
import pytest

import shoal
from shoal.config import EnvConfig
from shoal.core.errors import ConfigError
from shoal.envs.make import make_env
from shoal.envs.wrappers import parse_wrapper, wrapper_fns

QUIET = {"run.console": False, "run.tensorboard": False, "run.eval_every_steps": 0}
SMALL = {"env.num_envs": 2, "num_steps": 16, "minibatch_size": 16, "model.hidden": [16]}


@pytest.mark.parametrize(
    "spec, parsed",
    [
        ("ClipAction", ("ClipAction", {})),
        ("FrameStackObservation(stack_size=4)", ("FrameStackObservation", {"stack_size": 4})),
        (" TimeLimit( max_episode_steps = 7 ) ", ("TimeLimit", {"max_episode_steps": 7})),
        ("m.sub:Scale(factor=0.5, keys=('a',))", ("m.sub:Scale", {"factor": 0.5, "keys": ("a",)})),
    ],
)  # fmt: skip
def test_wrapper_specs_parse(spec, parsed):
    assert parse_wrapper(spec) == parsed


@pytest.mark.parametrize(
    "spec, message",
    [
        ("FrameStack(stack_size=4)", "did you mean FrameStackObservation"),
        ("TimeLimit(steps=3)", "bad arguments for TimeLimit"),
        ("TimeLimit(200)", "by keyword"),
        ("TimeLimit(max_episode_steps=x)", "must be a literal value"),
        ("TimeLimit(max_episode_steps=", "Name(key=value, ...)"),
        ("no_such_module_here:Wrap", "cannot import module 'no_such_module_here'"),
    ],
)
def test_bad_wrappers_are_named_before_any_env_is_built(spec, message):
    with pytest.raises(ConfigError, match="EnvConfig.wrappers entry") as exc:
        wrapper_fns(EnvConfig(id="Pendulum-v1", wrappers=(spec,)))
    assert message in str(exc.value)


def test_frame_stack_stacks_observations():
    env = make_env(EnvConfig(id="CartPole-v1", num_envs=3, frame_stack=4), seed=0)
    try:
        assert env.observation_space.shape == (4, 4)
        obs = env.reset(seed=0)
        assert obs.shape == (3, 4, 4)
        assert np.all(obs == obs[:, 3:])  # padded with the first observation
        obs = env.step(np.zeros(3, dtype=np.int64)).obs
        assert np.array_equal(obs[:, 2], env.reset(seed=0)[:, 3])
    finally:
        env.close()


def test_wrappers_apply_in_order_to_each_env():
    config = EnvConfig(
        id="Pendulum-v1",
        num_envs=2,
        wrappers=("ClipAction", "TimeLimit(max_episode_steps=5)"),
    )
    env = make_env(config, seed=0)
    try:
        env.reset(seed=0)
        for _ in range(4):
            result = env.step(np.full((2, 1), 100.0, dtype=np.float32))  # clipped to 2
            assert not result.truncated.any()
        assert env.step(np.zeros((2, 1), dtype=np.float32)).truncated.all()
    finally:
        env.close()


def test_a_users_own_wrapper_by_import_path(tmp_path, monkeypatch):
    (tmp_path / "my_wrappers.py").write_text(
        "import gymnasium as gym\n\n"
        "class Double(gym.RewardWrapper):\n"
        "    def __init__(self, env, factor=2.0):\n"
        "        super().__init__(env)\n"
        "        self.factor = factor\n\n"
        "    def reward(self, reward):\n"
        "        return self.factor * reward\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    config = EnvConfig(id="CartPole-v1", num_envs=1, wrappers=("my_wrappers:Double(factor=3.0)",))
    env = make_env(config, seed=0)
    try:
        env.reset(seed=0)
        assert env.step(np.zeros(1, dtype=np.int64)).reward[0] == 3.0
    finally:
        env.close()


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"vectorization": "native", "frame_stack": 2}, "wrappers apply to single envs"),
        ({"id": "shoal/spread-v0", "frame_stack": 2}, "not to the multi-agent env"),
    ],
)
def test_wrappers_where_they_cannot_apply_are_refused(fields, message):
    with pytest.raises(ConfigError, match=message):
        make_env(EnvConfig(**{"id": "CartPole-v1", **fields}), seed=0)


def test_a_wrapper_that_cannot_wrap_the_env_says_why():
    with pytest.raises(ConfigError, match="ClipAction cannot wrap CartPole-v1: .*Box"):
        make_env(EnvConfig(id="CartPole-v1", num_envs=1, wrappers=("ClipAction",)), seed=0)


def test_wrappers_with_the_atari_pipeline_are_refused():
    with pytest.raises(ConfigError, match="env.atari"):
        EnvConfig(id="ALE/Pong-v5", atari="deepmind", frame_stack=4)


def test_a_wrapped_run_is_rebuilt_by_load_eval_and_resume(tmp_path):
    """The wrappers are part of the run's config: the policy loads for stacked observations,
    and a resume continues on the same stacked env."""
    run_dir = tmp_path / "run"
    wrappers = ["TimeLimit(max_episode_steps=300)"]
    overrides = {**QUIET, **SMALL, "env.frame_stack": 3, "env.wrappers": wrappers}
    shoal.train("ppo", env="CartPole-v1", total_steps=64, run_dir=str(run_dir), **overrides)
    policy = shoal.load(run_dir)
    assert policy.act(np.zeros((3, 4), dtype=np.float32)) in (0, 1)
    assert policy.act(np.zeros((5, 3, 4), dtype=np.float32)).shape == (5,)
    resumed = shoal.train(resume=run_dir, total_steps=128)
    assert resumed.env_steps == 128
    config = shoal.train.__globals__["load_checkpoint"](run_dir).config
    assert config["env"]["frame_stack"] == 3 and config["env"]["wrappers"] == wrappers


def test_vector_wrappers_keep_native_vectorization_and_apply():
    env = make_env(
        EnvConfig(
            id="CartPole-v1",
            num_envs=3,
            vector_wrappers=("ClipReward(min_reward=0.0, max_reward=0.25)",),
        )
    )
    inner = env.env
    assert type(inner).__name__ == "ClipReward"
    assert type(inner.env).__name__ == "CartPoleVectorEnv"  # still the native vector env
    env.reset(seed=0)
    result = env.step(np.zeros(3, np.int64))
    np.testing.assert_array_equal(result.reward, [0.25, 0.25, 0.25])
    env.close()


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("ClipRewrd", "EnvConfig.vector_wrappers entry 'ClipRewrd'.*did you mean ClipReward"),
        ("ClipReward(minimum=0)", "bad arguments for ClipReward"),
        ("TimeLimit", "gymnasium.wrappers.vector has no wrapper 'TimeLimit'"),  # single-env only
    ],
)
def test_bad_vector_wrappers_are_named(spec, message):
    with pytest.raises(ConfigError, match=message):
        make_env(EnvConfig(id="CartPole-v1", vector_wrappers=(spec,)))


def test_vector_wrappers_are_rebuilt_for_evaluation_and_resume(tmp_path):
    run_dir = tmp_path / "run"
    wrappers = ["ClipReward(min_reward=0.0, max_reward=0.5)"]
    overrides = {**QUIET, **SMALL, "env.vector_wrappers": wrappers, "run.eval_every_steps": 64}
    seen = []
    shoal.train(
        "ppo",
        env="CartPole-v1",
        total_steps=64,
        run_dir=str(run_dir),
        on_iteration=lambda steps, metrics: seen.append(metrics),
        **overrides,
    )
    # CartPole pays 1 a step: clipped to 0.5 in training and in evaluation alike.
    assert seen[-1]["episode/return"] == 0.5 * seen[-1]["episode/length"]
    assert seen[-1]["eval/return"] == 0.5 * seen[-1]["eval/length"]
    resumed = shoal.train(
        resume=run_dir,
        total_steps=128,
        on_iteration=lambda steps, metrics: seen.append(metrics),
    )
    assert resumed.env_steps == 128
    assert seen[-1]["eval/return"] == 0.5 * seen[-1]["eval/length"]  # rebuilt on resume
    config = shoal.train.__globals__["load_checkpoint"](run_dir).config
    assert config["env"]["vector_wrappers"] == wrappers
