"""RolloutStorage, Rollout and the EnvRunner that fills them."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from shoal.collect import EnvRunner, LocalSampler
from shoal.config import EnvConfig, ModelConfig
from shoal.core.errors import UnsupportedSpaceError
from shoal.core.types import StepResult
from shoal.data import RolloutStorage, space_layout
from shoal.nn import ActorCritic, ActOutput

VECTOR_OBS = gym.spaces.Box(-1.0, 1.0, (4,), np.float64)
IMAGE_OBS = gym.spaces.Box(0, 255, (6, 5, 3), np.uint8)
DISCRETE = gym.spaces.Discrete(3)
BOX_ACTIONS = gym.spaces.Box(-2.0, 2.0, (2,), np.float32)


def step_result(reward, terminated, truncated, autoreset):
    return StepResult(
        obs=None,
        reward=np.asarray(reward, np.float32),
        terminated=np.asarray(terminated, bool),
        truncated=np.asarray(truncated, bool),
        autoreset=np.asarray(autoreset, bool),
        episode_returns=np.zeros(0),
        episode_lengths=np.zeros(0, np.int64),
    )


@pytest.mark.parametrize(
    ("space", "shape", "dtype"),
    [
        (DISCRETE, (), torch.int64),
        (BOX_ACTIONS, (2,), torch.float32),
        (VECTOR_OBS, (4,), torch.float32),
        (IMAGE_OBS, (6, 5, 3), torch.uint8),
    ],
)
def test_space_layout(space, shape, dtype):
    assert space_layout(space) == (shape, dtype)


def test_space_layout_rejects_other_spaces():
    with pytest.raises(UnsupportedSpaceError, match="Text"):
        space_layout(gym.spaces.Text(3))


@pytest.mark.parametrize(
    ("obs_space", "action_space", "obs_dtype", "action_shape", "action_dtype"),
    [
        (VECTOR_OBS, DISCRETE, torch.float32, (), torch.int64),
        (VECTOR_OBS, BOX_ACTIONS, torch.float32, (2,), torch.float32),
        (IMAGE_OBS, DISCRETE, torch.uint8, (), torch.int64),
    ],
)
def test_storage_shapes_and_dtypes(obs_space, action_space, obs_dtype, action_shape, action_dtype):
    storage = RolloutStorage(5, 3, obs_space, action_space)
    rollout = storage.rollout(last_values=torch.zeros(3))
    assert rollout.obs.shape == (5, 3, *obs_space.shape)
    assert rollout.obs.dtype == obs_dtype
    assert rollout.actions.shape == (5, 3, *action_shape)
    assert rollout.actions.dtype == action_dtype
    for name in ("log_probs", "values", "rewards"):
        assert getattr(rollout, name).shape == (5, 3)
        assert getattr(rollout, name).dtype == torch.float32
    for name in ("terminated", "truncated", "valid"):
        assert getattr(rollout, name).shape == (5, 3)
        assert getattr(rollout, name).dtype == torch.bool


def test_image_observations_are_stored_as_uint8():
    storage = RolloutStorage(2, 2, IMAGE_OBS, DISCRETE)
    frames = np.random.default_rng(0).integers(0, 256, (2, 6, 5, 3), dtype=np.uint8)
    row = storage.write_obs(1, frames)
    assert row.dtype == torch.uint8
    np.testing.assert_array_equal(storage.obs[1].numpy(), frames)


def test_write_obs_returns_the_stored_row():
    storage = RolloutStorage(4, 2, VECTOR_OBS, DISCRETE)
    obs = np.arange(8, dtype=np.float64).reshape(2, 4)
    row = storage.write_obs(2, obs)
    assert row.data_ptr() == storage.obs[2].data_ptr()  # no copy for the policy
    np.testing.assert_array_equal(row.numpy(), obs.astype(np.float32))


def test_write_step_stores_everything_and_valid_is_not_autoreset():
    storage = RolloutStorage(3, 4, VECTOR_OBS, BOX_ACTIONS)
    written = []
    for t in range(3):
        out = ActOutput(
            actions=torch.full((4, 2), float(t)),
            log_probs=torch.arange(4.0) - t,
            values=torch.arange(4.0) * 10 + t,
        )
        result = step_result(
            reward=[t, t + 0.5, -t, 1.0],
            terminated=[t == 1, False, False, False],
            truncated=[False, t == 0, False, False],
            autoreset=[t == 2, t == 1, False, False],
        )
        storage.write_step(t, out, result)
        written.append((out, result))
    rollout = storage.rollout(last_values=torch.tensor([1.0, 2.0, 3.0, 4.0]))
    for t, (out, result) in enumerate(written):
        assert torch.equal(rollout.actions[t], out.actions)
        assert torch.equal(rollout.log_probs[t], out.log_probs)
        assert torch.equal(rollout.values[t], out.values)
        np.testing.assert_array_equal(rollout.rewards[t].numpy(), result.reward)
        np.testing.assert_array_equal(rollout.terminated[t].numpy(), result.terminated)
        np.testing.assert_array_equal(rollout.truncated[t].numpy(), result.truncated)
        np.testing.assert_array_equal(rollout.valid[t].numpy(), ~result.autoreset)
    assert rollout.valid.sum() == 3 * 4 - 2


def test_next_values_shift_values_and_append_last_values():
    storage = RolloutStorage(3, 2, VECTOR_OBS, DISCRETE)
    storage.values.copy_(torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]))
    rollout = storage.rollout(last_values=torch.tensor([7.0, 8.0]))
    expected = torch.tensor([[3.0, 4.0], [5.0, 6.0], [7.0, 8.0]])
    assert torch.equal(rollout.next_values, expected)


def make_runner(num_envs=4, num_steps=32, seed=0, **env_kwargs):
    config = EnvConfig(id="CartPole-v1", num_envs=num_envs, **env_kwargs)
    model_cfg = ModelConfig(hidden=(8,))
    return EnvRunner(config, lambda o, a: ActorCritic(o, a, model_cfg), num_steps, seed=seed)


def test_env_runner_sample_shapes_and_episode_stats():
    runner = make_runner(max_episode_steps=10)
    sampler = LocalSampler(runner)
    assert sampler.num_envs == 4
    rollout, episodes = sampler.sample()
    assert rollout.obs.shape == (32, 4, 4) and rollout.obs.dtype == torch.float32
    assert rollout.actions.shape == (32, 4) and rollout.actions.dtype == torch.int64
    for name in ("log_probs", "values", "rewards", "terminated", "truncated", "valid"):
        assert getattr(rollout, name).shape == (32, 4), name
    assert rollout.last_values.shape == (4,)
    assert rollout.rewards.numel() == 32 * 4  # env steps, autoreset steps included

    done = rollout.terminated | rollout.truncated
    assert episodes.returns.size == int(done.sum()) > 0
    assert episodes.returns.dtype == np.float64 and episodes.lengths.dtype == np.int64
    # CartPole pays 1 per real step; episodes last at most max_episode_steps.
    np.testing.assert_array_equal(episodes.returns, episodes.lengths)
    assert episodes.lengths.min() >= 1 and episodes.lengths.max() <= 10
    # Exactly the steps after an episode end are autoreset (invalid) transitions.
    np.testing.assert_array_equal(~rollout.valid[1:], done[:-1])
    assert rollout.valid[0].all()
    # Rewards of valid transitions add up to the finished episodes plus the unfinished parts.
    assert rollout.rewards[rollout.valid].sum() >= episodes.returns.sum()
    # The stored log-probs and values are the runner model's outputs on the stored obs.
    dist, values = runner.model(rollout.obs[0])
    # (torch.testing.assert_close would import torch.distributed: a second of test time.)
    assert torch.allclose(values, rollout.values[0])
    assert torch.allclose(dist.log_prob(rollout.actions[0]), rollout.log_probs[0])
    assert torch.allclose(rollout.last_values, runner.model.value(torch.as_tensor(runner.obs)))
    sampler.close()


def test_env_runner_continues_episodes_across_samples():
    runner = make_runner(num_steps=8)
    runner.sample()
    pending = runner.obs.copy()
    rollout, _ = runner.sample()
    np.testing.assert_array_equal(rollout.obs[0].numpy(), pending)
    runner.close()


def test_env_runner_is_seeded():
    first, second, other = make_runner(seed=3), make_runner(seed=3), make_runner(seed=4)
    np.testing.assert_array_equal(first.obs, second.obs)
    assert not np.array_equal(first.obs, other.obs)
    for runner in (first, second, other):
        runner.close()


def test_env_runner_model_copy_follows_set_weights():
    runner = make_runner()
    learner_model = ActorCritic(
        runner.env.observation_space, runner.env.action_space, ModelConfig(hidden=(8,))
    )
    with torch.no_grad():
        for param in learner_model.parameters():
            param.add_(1.0)
    weights = learner_model.state_dict()
    runner.set_weights(weights)
    for name, tensor in runner.model.state_dict().items():
        assert torch.equal(tensor, weights[name]), name
        # A copy, not shared storage: the learner's later updates must not leak in.
        assert tensor.data_ptr() != weights[name].data_ptr(), name
    with torch.no_grad():
        next(learner_model.parameters()).add_(1.0)
    name = next(iter(weights))
    assert not torch.equal(runner.model.state_dict()[name], learner_model.state_dict()[name])
    assert not any(p.requires_grad for p in runner.model.parameters())
    runner.close()
