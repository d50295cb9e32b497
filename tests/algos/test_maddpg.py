"""MADDPG: the Gumbel-softmax estimator, centralized critic inputs, per-agent replay rewards,
smoke runs of every variant, and exact resume."""

import gymnasium as gym
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from duel_env import Duel
from duel_env import factory as duel_factory
from ma_line import factory
from state_helpers import assert_states_equal, metric_rows

import shoal
from shoal.algos.multi_agent.maddpg import MADDPG, MADDPGConfig, MADDPGLearner
from shoal.config import ModelConfig, ReplayConfig
from shoal.core.errors import ConfigError, ShoalError
from shoal.core.types import ReplayBatch
from shoal.data.replay import ReplayBuffer
from shoal.envs.multi_agent import AgentGroup, register_multi_agent_env
from shoal.nn.critics import critic_inputs, own_action_inputs, replace_own_actions
from shoal.train.checkpoint import load_checkpoint

ITERATION = 8  # 4 envs x 2 steps


def small(**extra):
    overrides = {
        "env.id": "shoal/spread-v0",
        "env.num_envs": 4,
        "rollout_steps": 2,
        "replay.gradient_steps": 2,
        "replay.batch_size": 16,
        "replay.learning_starts": ITERATION,
        "replay.buffer_size": 400,
        "model.hidden": (16,),
        "run.eval_every_steps": 0,
        "run.checkpoint_every_steps": 0,
        "run.console": False,
        "run.tensorboard": False,
    }
    overrides.update(extra)
    return overrides


def test_gumbel_softmax_is_one_hot_forward_and_softmax_backward():
    torch.manual_seed(0)
    logits = torch.tensor([[1.0, 2.0, 0.5]], requires_grad=True)
    weights = torch.tensor([[0.3, -1.0, 2.0]])
    sample = F.gumbel_softmax(logits, tau=1.0, hard=True)
    assert sample.sum() == 1 and set(sample.flatten().tolist()) == {0.0, 1.0}
    (sample * weights).sum().backward()
    # Straight-through: the gradient is that of the soft sample y = softmax((l + g) / tau),
    # dy_i/dl_j = y_i (delta_ij - y_j), with the same Gumbel noise g.
    torch.manual_seed(0)
    soft_logits = logits.detach().clone().requires_grad_(True)
    soft = F.gumbel_softmax(soft_logits, tau=1.0, hard=False)
    (soft * weights).sum().backward()
    torch.testing.assert_close(logits.grad, soft_logits.grad)
    y = soft.detach()[0]
    expected = y * (weights[0] - (y * weights[0]).sum())  # sum_i w_i y_i (delta_ij - y_j)
    torch.testing.assert_close(logits.grad[0], expected)


def learner(**extra):
    group = AgentGroup(
        "agent",
        ("agent_0", "agent_1", "agent_2"),
        gym.spaces.Box(-1, 1, (2,), np.float32),
        gym.spaces.Box(-1, 1, (1,), np.float32),
    )
    config = MADDPGConfig(
        model=ModelConfig(hidden=(8,)), replay=ReplayConfig(batch_size=4), **extra
    )
    return MADDPGLearner(config, [group], state_dim=5)


def test_critic_inputs_replace_only_the_agents_own_action():
    critic_obs = torch.arange(8.0).view(2, 4) * 0 + torch.tensor([[1.0, 2, 3, 4], [5, 6, 7, 8]])
    replayed = torch.tensor([[[0.1], [0.2], [0.3]], [[0.4], [0.5], [0.6]]])  # [M=2, N=3, 1]
    policy = torch.tensor([[[-1.0], [-2.0], [-3.0]], [[-4.0], [-5.0], [-6.0]]])
    inputs = own_action_inputs(critic_obs, replayed, policy)
    assert inputs.shape == (3, 2, 4 + 3)
    torch.testing.assert_close(inputs[:, :, :4], critic_obs.expand(3, 2, 4))
    # Critic i sees agent i's policy action and the others' replayed actions.
    torch.testing.assert_close(inputs[0, 0, 4:], torch.tensor([-1.0, 0.2, 0.3]))
    torch.testing.assert_close(inputs[1, 0, 4:], torch.tensor([0.1, -2.0, 0.3]))
    torch.testing.assert_close(inputs[2, 1, 4:], torch.tensor([0.4, 0.5, -6.0]))
    plain = critic_inputs(critic_obs, replayed)
    torch.testing.assert_close(plain[1], torch.tensor([5.0, 6, 7, 8, 0.4, 0.5, 0.6]))


def test_critic_input_state_reads_the_state_part_of_a_row():
    lrn = learner(critic_input="state")
    rows = torch.arange(11.0).view(1, 11)  # 3 agents x 2 obs, then a 5-dim state
    obs, critic_obs = lrn.layout._observations(rows)
    torch.testing.assert_close(obs["agent"], torch.arange(6.0).view(1, 3, 2))
    torch.testing.assert_close(critic_obs, torch.arange(6.0, 11.0).view(1, 5))
    plain = learner()  # critic_input observations: every agent's observation, no state
    obs, critic_obs = plain.layout._observations(torch.arange(6.0).view(1, 6))
    torch.testing.assert_close(critic_obs, torch.arange(6.0).view(1, 6))


def test_the_layout_splits_a_batch_with_its_n_step_returns():
    """`JointLayout.split` on a hand-made 2-step batch of 3 agents: returns r0 + gamma r1
    per agent, gamma^K as the discount (0 where the episode terminated)."""
    lrn = learner(critic_input="state")
    batch = ReplayBatch(
        obs=torch.arange(22.0).view(2, 11),
        actions=torch.tensor([[0.5, -0.5, 0.0], [1.0, 0.0, -1.0]]),
        rewards=torch.tensor([[[1.0, 2.0, 3.0], [1.0, 1.0, 1.0]], [[4.0, 0.0, 0.0], [0.0] * 3]]),
        steps=torch.tensor([2, 1]),
        terminated=torch.tensor([False, True]),
        next_obs=torch.zeros(2, 11),
        next_action_mask=None,
        weights=torch.tensor([1.0, 0.5]),
        indices=np.arange(2),
    )
    b = lrn.layout.split(batch, gamma=0.5)
    torch.testing.assert_close(b.returns, torch.tensor([[1.5, 2.5, 3.5], [4.0, 0.0, 0.0]]))
    torch.testing.assert_close(b.discounts, torch.tensor([0.25, 0.0]))
    torch.testing.assert_close(b.critic_obs, torch.arange(22.0).view(2, 11)[:, 6:])
    torch.testing.assert_close(b.actions, batch.actions)  # continuous: as stored
    torch.testing.assert_close(b.weights, batch.weights)


def test_replay_keeps_one_reward_per_agent_through_n_step_windows():
    replay = ReplayBuffer(
        40, 1, gym.spaces.Box(-1, 1, (2,)), gym.spaces.Box(-1, 1, (3,)), n_step=2,
        reward_shape=(3,),
    )  # fmt: skip
    for t in range(4):
        replay.add(np.full((1, 2), t), np.zeros((1, 3)), np.array([[t, 10 * t, -t]]),
                   np.array([False]), np.array([t == 3]), np.array([True]))  # fmt: skip
    batch = replay._gather(np.array([1]), np.ones(1, np.float32))
    torch.testing.assert_close(batch.rewards, torch.tensor([[[1.0, 10, -1], [2, 20, -2]]]))


VARIANTS = {
    "discrete": {},
    "continuous": {"env.kwargs": {"continuous": True}},
    "ou_noise": {"env.kwargs": {"continuous": True}, "noise.kind": "ou"},
    "rank_per": {"replay.prioritized": "rank"},
    "proportional_per_nstep": {"replay.prioritized": "proportional", "replay.n_step": 3},
    "state_critic": {"critic_input": "state"},
    "shared_actor": {"share_parameters": True},
    "cn_v1_messages": {
        "env.id": "shoal/cn-v1-v0",
        "env.kwargs": {"continuous": True, "message_dim": 1},
    },  # fmt: skip
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_smoke(variant, tmp_path):
    seen = []
    result = shoal.train(
        "maddpg",
        run_dir=str(tmp_path / variant),
        total_steps=4 * ITERATION,
        on_iteration=lambda step, metrics: seen.append(metrics),
        **small(**VARIANTS[variant]),
    )
    assert result.env_steps == 4 * ITERATION
    learned = [m for m in seen if "loss/critic" in m]
    assert len(learned) == 3 and learned[-1]["train/grad_steps"] == 6
    assert all(np.isfinite(m["loss/critic"]) and np.isfinite(m["loss/actor"]) for m in learned)
    logged = {key for m in seen for key in m}
    # Deployable through the public path, acting on rows of agents.
    config = shoal.load(result.run_dir).config
    env = shoal.make_env(config.env, num_envs=2)
    actions = shoal.load(result.run_dir).act(env.reset(seed=0))
    assert actions.shape[0] == 6
    env.close()
    if "episode/return" in logged:
        assert "episode/return/agent_0" in logged


def test_bad_inputs_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="critic_input"):
        shoal.build_config("maddpg", critic_input="everything")
    register_multi_agent_env("shoal-test/maddpg-line-v0", factory)
    with pytest.raises(ConfigError, match="no global state"):
        shoal.train("maddpg", run_dir=str(tmp_path / "s"),
                    **small(**{"env.id": "shoal-test/maddpg-line-v0", "critic_input": "state",
                               "env.kwargs": {"state": False}}))  # fmt: skip


@pytest.mark.parametrize("prioritized", ["none", "rank"])
def test_resume_with_saved_replay_is_exact(prioritized, tmp_path):
    first, total = 3 * ITERATION, 6 * ITERATION
    overrides = small(
        **{
            "replay.prioritized": prioritized,
            "replay.save": True,
            "run.checkpoint_every_steps": ITERATION,
            "optim.anneal_steps": total,
        }
    )
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    part = shoal.train("maddpg", seed=3, total_steps=first, run_dir=a, **overrides)
    resumed = shoal.train(resume=part.run_dir, total_steps=total)
    straight = shoal.train("maddpg", seed=3, total_steps=total, run_dir=b, **overrides)
    got = load_checkpoint(resumed.run_dir).state["algorithm"]
    want = load_checkpoint(straight.run_dir).state["algorithm"]
    assert_states_equal(got, want)
    assert metric_rows(resumed.run_dir) == metric_rows(straight.run_dir)


def test_actor_reg_adds_the_mean_squared_preactivations_of_every_agent():
    """Lowe et al.'s code adds 1e-3 * mean(logits^2) to each actor's loss; summed over agents
    that is, per group, N_g times the mean over its agents (checked by hand on Duel's two
    groups: red's 1 continuous pre-tanh action, the runners' 3 logits each)."""
    env = Duel(1)
    config = MADDPGConfig(model=ModelConfig(hidden=(8,)), replay=ReplayConfig(batch_size=4))
    actor = MADDPGLearner(config, list(env.groups.values()), state_dim=3).core.actor
    obs = {"red": torch.randn(5, 1, 3), "blue": torch.randn(5, 2, 2)}
    torch.manual_seed(1)
    actions, penalty = actor.actions_and_preactivations(obs)
    torch.manual_seed(1)
    torch.testing.assert_close(actions, actor(obs))  # the same actions, Gumbel noise included
    with torch.no_grad():
        red = actor.groups["red"].logits(obs["red"])  # [5, 1, 1]
        blue = actor.groups["blue"].logits(obs["blue"])  # [5, 2, 3]
    by_hand = float((red[:, 0] ** 2).mean()) + sum(float((blue[:, i] ** 2).mean()) for i in (0, 1))
    assert float(penalty) == pytest.approx(by_hand, rel=1e-5)


@pytest.mark.parametrize("reg", [0.0, 0.5])
def test_actor_reg_enters_the_actor_loss_only_when_set(reg):
    algo = MADDPG(shoal.build_config("maddpg", **small(actor_reg=reg)))
    try:
        seen = [algo.train_iteration() for _ in range(3)]
    finally:
        algo.close()
    logged = [m for m in seen if "loss/actor" in m]
    assert logged
    if reg:
        assert all(m["loss/actor_reg"] > 0 for m in logged)
    else:
        assert not any("loss/actor_reg" in m for m in logged)
    with pytest.raises(ConfigError, match="actor_reg"):
        shoal.build_config("maddpg", **small(actor_reg=-1.0))


def test_algorithm_runs_without_the_training_loop():
    algo = MADDPG(shoal.build_config("maddpg", **small()))
    try:
        for _ in range(3):
            algo.train_iteration()
        assert algo.env_steps == 3 * ITERATION
    finally:
        algo.close()


# --- several groups: Lowe et al.'s mixed games -------------------------------------------------

register_multi_agent_env("shoal-test/duel-v0", duel_factory)


def duel(**extra):
    return small(**{"env.id": "shoal-test/duel-v0", "env.kwargs": {}, **extra})


def test_critics_see_every_agent_across_groups():
    env = Duel(1)
    config = MADDPGConfig(model=ModelConfig(hidden=(8,)), replay=ReplayConfig(batch_size=4))
    lrn = MADDPGLearner(config, list(env.groups.values()), state_dim=3)
    actor = lrn.core.actor
    assert actor.num_agents == 3 and actor.obs_size == 3 + 2 * 2
    assert actor.action_size == 1 + 2 * 3 and lrn.layout.stored_size == 1 + 2
    own = actor.own_columns.int().tolist()  # red's 1 column, then each runner's 3 one-hots
    assert own == [[1, 0, 0, 0, 0, 0, 0], [0, 1, 1, 1, 0, 0, 0], [0, 0, 0, 0, 1, 1, 1]]
    stored = torch.tensor([[0.5, 2.0, 0.0]])  # red moves 0.5, blue_0 right, blue_1 left
    joint = lrn.layout._critic_actions(stored)
    torch.testing.assert_close(joint, torch.tensor([[0.5, 0, 0, 1, 1, 0, 0]]))
    policy = torch.full((1, 7), -1.0)
    inputs = replace_own_actions(torch.zeros(1, 2), joint, policy, actor.own_columns)
    torch.testing.assert_close(inputs[0, 0, 2:], torch.tensor([-1.0, 0, 0, 1, 1, 0, 0]))
    torch.testing.assert_close(inputs[2, 0, 2:], torch.tensor([0.5, 0, 0, 1, -1, -1, -1]))
    # Every critic reads every agent's observation and action: red's critic moves when only
    # a runner's observation or action changes.
    obs = torch.zeros(1, actor.obs_size)
    base = lrn.core.critic.evaluate(critic_inputs(obs, joint)).squeeze(-1)
    moved_obs = obs.clone()
    moved_obs[0, -1] = 3.0  # blue_1's second feature
    moved_action = joint.clone()
    moved_action[0, 4:] = torch.tensor([0.0, 0.0, 1.0])  # blue_1 goes right
    for changed in (critic_inputs(moved_obs, joint), critic_inputs(obs, moved_action)):
        q = lrn.core.critic.evaluate(changed).squeeze(-1)
        assert (q - base).abs().min() > 0, "each critic sees the change"


def test_two_groups_learn_at_once_evaluate_and_deploy(tmp_path):
    seen = []
    result = shoal.train(
        "maddpg",
        run_dir=str(tmp_path / "duel"),
        total_steps=4 * ITERATION,
        on_iteration=lambda step, metrics: seen.append(metrics),
        **duel(**{"run.eval_every_steps": 2 * ITERATION, "run.eval_episodes": 3}),
    )
    logged = {key for m in seen for key in m}
    for group in ("red", "blue"):
        assert {f"loss/{group}/critic", f"loss/{group}/actor"} <= logged
        assert {f"episode/return/{group}", f"eval/return/{group}"} <= logged
    assert {"episode/return/red_0", "episode/return/blue_1", "eval/return/blue_0"} <= logged
    learned = [m for m in seen if "loss/critic" in m]
    for m in learned:
        total = m["loss/red/critic"] + m["loss/blue/critic"]
        assert m["loss/critic"] == pytest.approx(total, rel=1e-5)
    policy = shoal.load(result.run_dir)
    obs, _ = Duel(2).reset(seed=0)
    actions = policy.act(obs)
    assert actions["red"].shape == (2, 1, 1) and actions["blue"].shape == (2, 2)
    assert np.abs(actions["red"]).max() <= 1 and set(np.unique(actions["blue"])) <= {0, 1, 2}
    one = policy.act({g: o[1] for g, o in obs.items()})  # one env's observations
    np.testing.assert_array_equal(one["blue"], actions["blue"][1])
    with pytest.raises(ShoalError, match="missing \\['blue'\\]"):
        policy.act({"red": obs["red"]})


def test_two_group_resume_is_exact(tmp_path):
    first, total = 3 * ITERATION, 6 * ITERATION
    overrides = duel(
        **{"replay.save": True, "run.checkpoint_every_steps": ITERATION, "noise.kind": "ou"}
    )
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    part = shoal.train("maddpg", seed=4, total_steps=first, run_dir=a, **overrides)
    resumed = shoal.train(resume=part.run_dir, total_steps=total)
    straight = shoal.train("maddpg", seed=4, total_steps=total, run_dir=b, **overrides)
    got = load_checkpoint(resumed.run_dir).state["algorithm"]
    want = load_checkpoint(straight.run_dir).state["algorithm"]
    assert_states_equal(got, want)
    assert metric_rows(resumed.run_dir) == metric_rows(straight.run_dir)


@pytest.mark.extra("pettingzoo")
@pytest.mark.parametrize("game", ["simple_adversary_v3", "simple_tag_v3"])
def test_mpe_mixed_games_train_every_group(game, tmp_path):
    seen = []
    shoal.train(
        "maddpg",
        run_dir=str(tmp_path / game),
        total_steps=3 * ITERATION,
        on_iteration=lambda step, metrics: seen.append(metrics),
        **small(**{"env.id": f"pettingzoo:mpe2.{game}", "env.kwargs": {"max_cycles": 4}}),
    )
    logged = {key for m in seen for key in m}
    for group in ("adversary", "agent"):  # both games' groups learn
        assert f"loss/{group}/critic" in logged and f"episode/return/{group}" in logged
