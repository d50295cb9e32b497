"""QMIX, VDN and IQL: mixers, episode replay, the masked TD loss, smoke runs, checkpoints."""

import numpy as np
import pytest
import torch
from duel_env import factory as duel_factory
from state_helpers import assert_states_equal, metric_rows

import shoal
from shoal.algos.multi_agent.qmix import QMIXConfig, QMIXNetworks
from shoal.config import EnvConfig, ReplayConfig
from shoal.core.errors import ConfigError, UnsupportedSpaceError
from shoal.data.episode_replay import EpisodeBuilder, EpisodeReplay
from shoal.envs.multi_agent import MultiAgentStep, register_multi_agent_env
from shoal.losses.value_decomposition import double_q_next_values, masked_td_loss, td_targets
from shoal.nn.mixers import QMixer, RecurrentAgent, RecurrentQPolicy, VDNMixer
from shoal.nn.policy import ActorPolicy
from shoal.train.checkpoint import load_checkpoint

# 8 envs x 2 vector steps = 16 env steps (8 two-step episodes) per iteration.
ITERATION = 16


def small(algo="qmix", **extra):
    """Small settings for ``algo`` (VDN and IQL have no mixing network to size)."""
    overrides = {
        "env.num_envs": 8,
        "rollout_steps": 2,
        "replay.batch_size": 4,
        "replay.learning_starts": 4,
        "replay.buffer_size": 64,
        "target_update_every": 3,
        "exploration_steps": 4 * ITERATION,
        "model.hidden": (8,),
        "rnn_hidden": 8,
        "mixing_embed_dim": 4,
        "run.eval_every_steps": 0,
        "run.checkpoint_every_steps": 0,
        "run.console": False,
        "run.tensorboard": False,
    }
    if algo != "qmix":
        del overrides["mixing_embed_dim"]
    overrides.update(extra)
    return overrides


@pytest.mark.parametrize("layers", [1, 2])
def test_qmix_mixer_is_monotonic(layers):
    torch.manual_seed(0)
    mixer = QMixer(n_agents=3, state_dim=5, embed_dim=8, hypernet_layers=layers)
    states = torch.randn(64, 5) * 3
    w1, w2 = mixer.mixing_weights(states)
    assert w1.shape == (64, 3, 8) and w2.shape == (64, 8)
    assert (w1 >= 0).all() and (w2 >= 0).all()
    qs = (torch.randn(64, 3) * 5).requires_grad_(True)
    q_tot = mixer(qs, states)
    assert q_tot.shape == (64,)
    (grad,) = torch.autograd.grad(q_tot.sum(), qs)
    assert (grad >= 0).all()
    # Leading axes pass through: [T, B, N] values and [T, B, S] states.
    assert mixer(qs.detach().view(4, 16, 3), states.view(4, 16, 5)).shape == (4, 16)


def test_vdn_is_the_sum_and_iql_has_no_mixer():
    qs = torch.randn(2, 5, 3)
    assert torch.allclose(VDNMixer()(qs, None), qs.sum(-1))
    config = QMIXConfig(mixer="none")
    assert QMIXNetworks(config, 7, 2, 2, 3).mixer is None
    assert isinstance(QMIXNetworks(QMIXConfig(mixer="vdn"), 7, 2, 2, 3).mixer, VDNMixer)


def test_recurrent_agent_unroll_matches_step_by_step():
    torch.manual_seed(0)
    agent = RecurrentAgent(4, (8,), 6, 3)
    x = torch.randn(5, 7, 4)
    h = agent.initial_state(7)
    steps = []
    for t in range(5):
        q, h = agent(x[t], h)
        steps.append(q)
    assert torch.allclose(agent.unroll(x), torch.stack(steps), atol=1e-6)
    policy = RecurrentQPolicy(agent, last_action=False)
    policy.distribution(x[0]).mode()
    second = policy.distribution(x[1]).choice.q
    assert torch.allclose(second, steps[1], atol=1e-6)
    policy.reset_state()
    assert torch.allclose(policy.distribution(x[0]).choice.q, steps[0], atol=1e-6)
    # A deployed policy told that row 2's episode starts: row 2 restarts from zero, the
    # others go on from their state.
    ActorPolicy(policy).act(x[1].numpy(), episode_start=np.arange(7) == 2)
    restart = (torch.arange(7) == 2)[:, None]
    _, h0 = agent(x[0], agent.initial_state(7))
    _, want = agent(x[1], torch.where(restart, 0.0, h0))
    assert torch.allclose(policy._h, want, atol=1e-6)


def _step(b, obs, rew, term, trunc, autoreset, active=None):
    n = obs.shape[1]
    term, trunc = np.asarray(term, bool), np.asarray(trunc, bool)
    return MultiAgentStep(
        obs={"g": obs},
        rewards={"g": np.asarray(rew, np.float32)[:, None].repeat(n, 1)},
        terminated={"g": term[:, None].repeat(n, 1)},
        truncated={"g": trunc[:, None].repeat(n, 1)},
        active={"g": ~np.asarray(autoreset)[:, None].repeat(n, 1) if active is None else active},
        autoreset=np.asarray(autoreset, bool),
        state=obs[:, 0, :] * 10,
        episode_returns={},
        episode_lengths=np.zeros(0, np.int64),
    )


def _obs(values):
    """[2 envs, 2 agents, 1] observations from one value per env."""
    return np.asarray(values, np.float32)[:, None, None].repeat(2, 1)


def test_episode_builder_pads_masks_and_skips_autoreset_steps():
    replay = EpisodeReplay(capacity=10, max_len=3, n_agents=2, obs_shape=(1,), state_dim=1)
    builder = EpisodeBuilder(2, replay, "g")
    builder.start({"g": _obs([1, 11])}, _obs([1, 11])[:, 0] * 10)
    acts = np.ones((2, 2), np.int64)
    # env 0: 1-step episode (terminated), autoreset, another 1-step episode;
    # env 1: 3-step episode cut by truncation.
    builder.add(acts, _step(2, _obs([2, 12]), [5, 1], [True, False], [False, False], [0, 0]))
    assert len(replay) == 1
    builder.add(acts * 0, _step(2, _obs([3, 13]), [0, 2], [False, False], [False, False], [1, 0]))
    n = builder.add(acts, _step(2, _obs([4, 14]), [6, 3], [True, False], [False, True], [0, 0]))
    assert n == 2 and len(replay) == 3
    lengths = replay.lengths[:3].tolist()
    assert lengths == [1, 1, 3]
    first, long = replay.data, 2
    np.testing.assert_array_equal(first["filled"][0], [True, False, False])
    np.testing.assert_array_equal(first["obs"][0, :, 0, 0], [1, 2, 0, 0])
    np.testing.assert_array_equal(first["terminated"][0], [True, False, False])
    np.testing.assert_array_equal(first["rewards"][0, :, 0], [5, 0, 0])
    # The autoreset step's obs (3) starts env 0's second episode; its actions are not stored.
    np.testing.assert_array_equal(first["obs"][1, :, 0, 0], [3, 4, 0, 0])
    np.testing.assert_array_equal(first["rewards"][1, :, 0], [6, 0, 0])
    np.testing.assert_array_equal(first["filled"][long], [True, True, True])
    np.testing.assert_array_equal(first["obs"][long, :, 0, 0], [11, 12, 13, 14])
    np.testing.assert_array_equal(first["state"][long, :, 0], [110, 120, 130, 140])
    np.testing.assert_array_equal(first["actions"][long, :, 0], [1, 0, 1])
    assert not first["terminated"][long].any()  # truncated: bootstrap from the final obs
    batch = replay.sample(6)
    steps = int(replay.lengths[batch.indices].max())
    assert batch.obs.shape == (steps + 1, 6, 2, 1) and batch.filled.shape == (steps, 6)
    np.testing.assert_array_equal(batch.filled.sum(0).numpy(), replay.lengths[batch.indices])


def test_episode_builder_cuts_long_episodes():
    replay = EpisodeReplay(capacity=10, max_len=2, n_agents=2, obs_shape=(1,), state_dim=1)
    builder = EpisodeBuilder(2, replay, "g")
    builder.start({"g": _obs([1, 11])}, _obs([1, 11])[:, 0])
    acts = np.zeros((2, 2), np.int64)
    for k in range(3):
        builder.add(acts, _step(2, _obs([2 + k, 12 + k]), [0, 0], [k == 2] * 2, [0, 0], [0, 0]))
    assert replay.lengths[: len(replay)].tolist() == [2, 2, 1, 1]
    np.testing.assert_array_equal(replay.data["obs"][0, :, 0, 0], [1, 2, 3])
    np.testing.assert_array_equal(replay.data["obs"][2, :, 0, 0], [3, 4, 0])
    assert not replay.data["terminated"][0].any() and replay.data["terminated"][2, 0]


def test_replay_state_round_trip():
    replay = EpisodeReplay(capacity=4, max_len=2, n_agents=2, obs_shape=(1,), seed=3)
    episode = {k: np.ones((1, *v.shape[1:]), v.dtype) for k, v in replay.data.items()}
    for _ in range(5):
        replay.add(episode, np.array([2]))
    copy = EpisodeReplay(capacity=4, max_len=2, n_agents=2, obs_shape=(1,), seed=9)
    copy.load_state_dict(replay.state_dict())
    assert len(copy) == 4 and copy.episodes_added == 5
    assert np.array_equal(copy.sample(8).indices, replay.sample(8).indices)


def test_masked_td_loss_by_hand():
    q = torch.tensor([[1.0, 2.0], [3.0, 0.0]], requires_grad=True)  # [T=2, B=2]
    rewards = torch.tensor([[1.0, 0.0], [2.0, 9.0]])
    terminated = torch.tensor([[False, False], [True, False]])
    next_values = torch.tensor([[4.0, 5.0], [7.0, 9.0]])
    valid = torch.tensor([[True, True], [True, False]])  # episode 1 has one step
    targets = td_targets(rewards, terminated, next_values, 0.5)
    torch.testing.assert_close(targets, torch.tensor([[3.0, 2.5], [2.0, 13.5]]))
    loss, metrics = masked_td_loss(q, targets, valid)
    # errors: 1-3=-2, 2-2.5=-0.5, 3-2=1 (padding ignored): (4 + 0.25 + 1) / 3
    assert loss.item() == pytest.approx(5.25 / 3)
    assert metrics["train/td_error_abs"].item() == pytest.approx(3.5 / 3)
    loss.backward()
    assert q.grad[1, 1] == 0.0
    # IQL shapes: [T, B, N] with terminated [T, B] broadcast over agents.
    iql = td_targets(rewards[..., None].expand(2, 2, 3), terminated, torch.ones(2, 2, 3), 1.0)
    assert iql.shape == (2, 2, 3) and iql[1, 0, 0] == 2.0 and iql[0, 0, 0] == 2.0


def test_double_q_next_values_uses_online_argmax_and_masks():
    online = torch.tensor([[1.0, 5.0, 2.0]])
    target = torch.tensor([[10.0, 20.0, 30.0]])
    assert double_q_next_values(online, target).item() == 20.0
    assert double_q_next_values(online, target, double_q=False).item() == 30.0
    mask = torch.tensor([[True, False, True]])
    assert double_q_next_values(online, target, mask).item() == 30.0


@pytest.mark.parametrize("algo", ["qmix", "vdn", "iql"])
def test_smoke_train_evaluate_load(algo, tmp_path):
    seen = []
    result = shoal.train(
        algo,
        run_dir=str(tmp_path / algo),
        total_steps=4 * ITERATION,
        on_iteration=lambda step, metrics: seen.append(metrics),
        **small(algo, **{"run.eval_every_steps": 2 * ITERATION, "run.eval_episodes": 3}),
    )
    assert result.env_steps == 4 * ITERATION
    assert result.eval_return in (0.0, 1.0, 7.0, 8.0)
    last = seen[-1]
    for key in ("loss/td", "train/epsilon", "train/q_tot_mean", "episode/return"):
        assert np.isfinite(last[key]), key
    assert last["episode/return/agent_0"] == last["episode/return/agent_1"]
    policy = shoal.load(result.run_dir)
    env = shoal.make_env(policy.config.env, num_envs=2)
    actions = policy.act(env.reset(seed=0))
    assert actions.shape == (4,) and set(actions.tolist()) <= {0, 1}


def test_spread_smoke_with_last_action(tmp_path):
    result = shoal.train(
        "qmix",
        run_dir=str(tmp_path / "spread"),
        total_steps=2 * 4 * 25,
        **small(
            **{
                "env.id": "shoal/spread-v0",
                "env.num_envs": 4,
                "rollout_steps": 25,
                "replay.learning_starts": 4,
                "last_action": True,
                "hypernet_layers": 2,
                "optimizer": "adam",
                "run.eval_every_steps": 100,
                "run.eval_episodes": 2,
            }
        ),
    )
    assert result.env_steps == 200 and np.isfinite(result.eval_return)


@pytest.mark.parametrize("algo", ["qmix", "vdn", "iql"])
def test_resume_with_saved_replay_is_exact(algo, tmp_path):
    opts = small(algo, last_action=True, **{"replay.save": True})
    total = 6 * ITERATION
    straight = shoal.train(algo, run_dir=str(tmp_path / "a"), total_steps=total, **opts)
    part = shoal.train(algo, run_dir=str(tmp_path / "b"), total_steps=3 * ITERATION, **opts)
    resumed = shoal.train(resume=part.run_dir, total_steps=total)
    want = load_checkpoint(straight.run_dir).state
    got = load_checkpoint(resumed.run_dir).state
    assert_states_equal(got["algorithm"], want["algorithm"])
    assert_states_equal(got["rng"], want["rng"])
    assert metric_rows(resumed.run_dir) == metric_rows(straight.run_dir)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"mixer": "qtran"}, "mixer"),
        ({"hypernet_layers": 3}, "hypernet_layers"),
        ({"replay": ReplayConfig(buffer_size=8, batch_size=16)}, "buffer_size"),
        ({"replay": ReplayConfig(n_step=3)}, "n_step"),
        ({"replay": ReplayConfig(prioritized="rank")}, "prioritized"),
        ({"gamma": 1.5}, "gamma"),
        ({"epsilon_end": -0.1}, "epsilon_end"),
        ({"target_update_every": 0}, "target_update_every"),
        ({"episode_limit": 0}, "episode_limit"),
        ({"env": EnvConfig(id="shoal/two-step-v0", normalize_obs=True)}, "normalize_obs"),
    ],
)
def test_bad_config_names_the_field(changes, field):
    with pytest.raises(ConfigError, match=field):
        QMIXConfig(**changes)


def test_continuous_actions_are_refused(tmp_path):
    with pytest.raises(UnsupportedSpaceError, match="Discrete"):
        shoal.train(
            "vdn",
            run_dir=str(tmp_path / "c"),
            total_steps=ITERATION,
            **small("vdn", **{"env.id": "shoal/spread-v0", "env.kwargs": {"continuous": True}}),
        )


register_multi_agent_env("shoal-test/duel-v0", duel_factory)


def test_the_team_trains_against_a_fixed_opponent_and_resumes_exactly(tmp_path):
    """Duel's two runners (Discrete) are the team; the chaser (continuous) acts at random,
    from its own generator, which checkpoints carry."""
    opts = small(**{"env.id": "shoal-test/duel-v0", "env.group": "blue",
                    "env.opponents": {"red": "random"}, "env.agent_id": True,
                    "replay.save": True, "episode_limit": 5})  # fmt: skip
    total = 6 * ITERATION
    straight = shoal.train("qmix", run_dir=str(tmp_path / "a"), total_steps=total, **opts)
    part = shoal.train("qmix", run_dir=str(tmp_path / "b"), total_steps=3 * ITERATION, **opts)
    resumed = shoal.train(resume=part.run_dir, total_steps=total)
    want = load_checkpoint(straight.run_dir).state["algorithm"]
    got = load_checkpoint(resumed.run_dir).state["algorithm"]
    assert_states_equal(got, want)
    assert "red" in got["runner"]["acting"]["opponents"]
    assert metric_rows(resumed.run_dir) == metric_rows(straight.run_dir)
    rows = metric_rows(straight.run_dir)
    assert any("episode/return/blue_1" in row for row in rows)
    assert not any("episode/return/red_0" in row for row in rows)  # only the team's returns


def test_an_opposing_group_needs_a_fixed_policy(tmp_path):
    with pytest.raises(ConfigError, match="--env.group red --env.opponents blue random"):
        shoal.train("vdn", run_dir=str(tmp_path / "x"), total_steps=ITERATION,
                    **small("vdn", **{"env.id": "shoal-test/duel-v0"}))  # fmt: skip
