"""An in-process runner's own torch stream (``own_torch_seed``): it samples what a runner
owning its process's generator with that seed samples (a Ray runner), whatever else draws
from the process's generator in between, and a checkpoint carries it."""

import functools

import torch

from shoal.algos.policy_gradient.ppo import PPOConfig, build_model
from shoal.collect import EnvRunner
from shoal.config import EnvConfig

CONFIG = PPOConfig(env=EnvConfig(num_envs=3))
model_fn = functools.partial(build_model, CONFIG)


def rollouts(runner, count, between=None):
    out = []
    for _ in range(count):
        rollout, _ = runner.sample()
        out.append(rollout.actions.clone())
        if between is not None:
            between()
    return out


def test_own_stream_samples_what_a_runner_owning_the_process_generator_samples():
    owner = EnvRunner(CONFIG.env, model_fn, 16, seed=1, torch_seed=99, acting="torch")
    expected = rollouts(owner, 4)
    owner.close()
    torch.manual_seed(1234)  # the learner's stream: another state entirely
    before = torch.get_rng_state()
    own = EnvRunner(CONFIG.env, model_fn, 16, seed=1, own_torch_seed=99, acting="torch")
    got = rollouts(own, 2)
    # building and sampling drew from the runner's stream only
    assert torch.equal(torch.get_rng_state(), before)
    got += rollouts(own, 2, between=lambda: torch.rand(7))  # the learner draws in between
    assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))
    own.close()


def test_own_stream_resumes_from_a_checkpoint():
    runner = EnvRunner(CONFIG.env, model_fn, 16, seed=1, own_torch_seed=5, acting="torch")
    rollouts(runner, 2)
    state = runner.get_state()
    expected = rollouts(runner, 2)
    resumed = EnvRunner(CONFIG.env, model_fn, 16, seed=1, own_torch_seed=5, acting="torch")
    resumed.set_weights(runner.model.state_dict())
    assert resumed.set_state(state, fallback_seed=0)
    assert all(torch.equal(a, b) for a, b in zip(expected, rollouts(resumed, 2), strict=True))
    runner.close()
    resumed.close()
