"""Multi-agent envs as a batch of agents: layout, masking, per-agent returns, and PPO on top
(shared weights, IPPO and MAPPO)."""

import numpy as np
import pytest
import torch
from ma_line import GOAL, MALine, factory
from state_helpers import assert_states_equal, metric_rows

import shoal
from shoal.config import EnvConfig, ModelConfig
from shoal.core.errors import ConfigError
from shoal.envs.agents_as_batch import AgentsAsBatch, split_observation
from shoal.envs.multi_agent import register_multi_agent_env
from shoal.nn.actor_critic import ActorCritic
from shoal.train.checkpoint import load_checkpoint

ENV_ID = "shoal-test/line-v0"
register_multi_agent_env(ENV_ID, factory)


def test_rows_are_env_agent_pairs_with_ids_and_a_critic_part():
    env = AgentsAsBatch(MALine(3), agent_id=True, global_state=True)
    assert env.num_envs == 6 and env.agents_per_env == 2
    assert split_observation(env.observation_space) == (3, 4)  # obs + id | state + id
    obs = env.reset(seed=0)
    assert obs.shape == (6, 7)
    result = env.step(np.array([1, 0] * 3))
    rows = result.obs.reshape(3, 2, 7)
    np.testing.assert_allclose(rows[:, 0, 0], 1 / GOAL)  # agent 0 moved, agent 1 stayed
    np.testing.assert_allclose(rows[:, 1, 0], 0.0)
    np.testing.assert_array_equal(rows[0, :, 1:3], np.eye(2))  # agent one-hot
    np.testing.assert_allclose(rows[:, :, 3:5], [[[0.25, 0.0]] * 2] * 3)  # global state
    np.testing.assert_array_equal(rows[0, :, 5:7], np.eye(2))


def test_a_finished_agent_is_masked_until_its_env_resets():
    env = AgentsAsBatch(MALine(1, max_steps=8))
    env.reset(seed=0)
    for _ in range(GOAL - 1):
        result = env.step(np.array([1, 0]))
        assert not result.autoreset.any()
    result = env.step(np.array([1, 0]))  # agent 0 arrives: terminated, return 1 reported
    np.testing.assert_array_equal(result.terminated, [True, False])
    np.testing.assert_array_equal(result.episode_returns, [1.0])
    np.testing.assert_array_equal(result.episode_agents, [0])
    np.testing.assert_array_equal(result.episode_lengths, [GOAL])
    result = env.step(np.array([1, 1]))  # agent 0 is inactive: its row is masked
    np.testing.assert_array_equal(result.autoreset, [True, False])
    assert result.reward[0] == 0.0
    for _ in range(3):
        result = env.step(np.array([1, 0]))
    # Step 8: agent 1 (at cell 1) is cut by the time limit with return 0.
    np.testing.assert_array_equal(result.truncated, [False, True])
    np.testing.assert_array_equal(result.episode_returns, [0.0])
    np.testing.assert_array_equal(result.episode_agents, [1])
    result = env.step(np.array([1, 1]))  # the env resets: both rows masked
    np.testing.assert_array_equal(result.autoreset, [True, True])
    result = env.step(np.array([1, 1]))
    np.testing.assert_array_equal(result.autoreset, [False, False])


def test_errors_name_the_problem():
    with pytest.raises(ConfigError, match="groups"):
        AgentsAsBatch(MALine(1, groups=2))
    with pytest.raises(ConfigError, match="no global state"):
        AgentsAsBatch(MALine(1, state=False), global_state=True)
    with pytest.raises(ConfigError, match="shared_trunk"):
        env = AgentsAsBatch(MALine(1), global_state=True)
        ActorCritic(env.observation_space, env.action_space, ModelConfig(shared_trunk=True))


def test_the_actor_never_sees_the_critic_part():
    env = AgentsAsBatch(MALine(2), agent_id=True, global_state=True)
    model = ActorCritic(env.observation_space, env.action_space, ModelConfig(hidden=(8,)))
    obs = torch.as_tensor(env.reset(seed=0))
    changed = obs.clone()
    changed[:, 3:5] += 1.0  # the global state
    dist, value = model(obs)
    dist2, value2 = model(changed)
    torch.testing.assert_close(dist.logits, dist2.logits)
    assert not torch.allclose(value, value2)


def small(**extra):
    overrides = {
        "env.id": ENV_ID,
        "env.num_envs": 4,
        "num_steps": 8,
        "minibatch_size": 32,
        "num_epochs": 2,
        "model.hidden": (16,),
        "run.eval_every_steps": 0,
        "run.checkpoint_every_steps": 0,
        "run.console": False,
        "run.tensorboard": False,
    }
    overrides.update(extra)
    return overrides


@pytest.mark.parametrize("algo", ["mappo", "ippo"])
def test_multi_agent_ppo_counts_env_steps_and_logs_returns_per_agent(algo, tmp_path):
    seen = []
    result = shoal.train(
        algo,
        run_dir=str(tmp_path / algo),
        total_steps=3 * 32,
        on_iteration=lambda step, metrics: seen.append((step, metrics)),
        **small(),
    )
    assert [step for step, _ in seen] == [32, 64, 96]  # 4 envs x 8 steps, not x 2 agents
    logged = {key for _, metrics in seen for key in metrics}
    assert {"episode/return/agent_0", "episode/return/agent_1"} <= logged
    config = shoal.load(result.run_dir).config
    assert config.env.global_state == (algo == "mappo") and config.env.agent_id
    # The deployed policy acts on the same rows: evaluation through the public path works.
    policy = shoal.load(result.run_dir)
    env = shoal.make_env(EnvConfig(id=ENV_ID, agent_id=True, global_state=algo == "mappo"), 2)
    assert policy.act(env.reset(seed=0)).shape == (4,)
    env.close()


@pytest.mark.parametrize("algo", ["mappo", "ippo"])
def test_resume_is_exact(algo, tmp_path):
    overrides = small(**{"run.checkpoint_every_steps": 32})
    part = shoal.train(algo, seed=1, total_steps=64, run_dir=str(tmp_path / "a"), **overrides)
    resumed = shoal.train(resume=part.run_dir, total_steps=128)
    straight = shoal.train(algo, seed=1, total_steps=128, run_dir=str(tmp_path / "b"), **overrides)
    got = load_checkpoint(resumed.run_dir).state["algorithm"]
    want = load_checkpoint(straight.run_dir).state["algorithm"]
    assert_states_equal(got, want)
    assert metric_rows(resumed.run_dir) == metric_rows(straight.run_dir)
