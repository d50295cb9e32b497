"""CTEDD (Chen 2019): the exploration-scale gradient's sign, the distillation loss, the
local policies' message flow, smoke runs, exact resume and the exported local policy."""

import numpy as np
import pytest
import torch
from state_helpers import assert_states_equal

import shoal
from shoal.algos.multi_agent.ctedd import CTEDD, CTEDDConfig
from shoal.algos.multi_agent.distillation import chronological_rows
from shoal.config import replace
from shoal.core.errors import ConfigError
from shoal.losses.distillation import distillation_loss, exploration_scale_loss
from shoal.nn.local_policies import ExplorationScale, LocalPolicies
from shoal.train.checkpoint import load_checkpoint

ITERATION = 8  # 4 envs x 2 steps


def small(**extra):
    overrides = {
        "env.id": "shoal/cn-v1-v0",
        "env.num_envs": 4,
        "rollout_steps": 2,
        "replay.gradient_steps": 2,
        "replay.batch_size": 16,
        "replay.learning_starts": ITERATION,
        "replay.buffer_size": 400,
        "model.hidden": (16,),
        "global_hidden": (8,),
        "local_hidden": (8,),
        "distill_every": 2 * ITERATION,
        "distill_batch_size": 8,
        "distill_repeats": 2,
        "run.eval_every_steps": 0,
        "run.eval_episodes": 2,
        "run.checkpoint_every_steps": 0,
        "run.console": False,
        "run.tensorboard": False,
    }
    overrides.update(extra)
    return overrides


def scale_gradient(eps: float, advantage: float) -> float:
    """d loss / d sigma for one sample a = mu + sigma * eps (one agent, one dimension)."""
    sigma = torch.tensor([[[0.5]]], requires_grad=True)
    mean = torch.zeros(1, 1, 1)
    actions = mean + 0.5 * eps
    loss, _ = exploration_scale_loss(actions, mean, sigma, torch.tensor([advantage]), alpha=0.0)
    loss.backward()
    return float(sigma.grad)


def test_exploration_scale_grows_when_exploring_beat_the_deterministic_action():
    # The sample explored beyond one scale (|eps| > 1): descending the loss widens sigma when
    # Q(s, a_sampled) - Q(s, mu(s)) > 0 and narrows it when < 0 (Chen 2019, Eq. (5)).
    for eps in (2.0, -1.5):
        assert -scale_gradient(eps, +1.0) > 0
        assert -scale_gradient(eps, -1.0) < 0
    # A sample inside one scale that paid off narrows sigma (score function: (eps^2 - 1) / sigma).
    assert -scale_gradient(0.5, +1.0) < 0
    # Exact value: d/dsigma [-(A log N(a; 0, sigma))] = -A (eps^2 - 1) / sigma.
    assert scale_gradient(2.0, 0.7) == pytest.approx(-0.7 * 3.0 / 0.5)


def test_entropy_term_widens_the_scale_without_advantage():
    sigma = torch.tensor([[[0.5, 0.25]]], requires_grad=True)
    zeros = torch.zeros(1, 1, 2)
    loss, stats = exploration_scale_loss(zeros, zeros, sigma, torch.zeros(1, 1), alpha=0.1)
    loss.backward()
    # Entropy log(sigma) + const per dimension: gradient of -alpha * H is -alpha / sigma.
    torch.testing.assert_close(sigma.grad, torch.tensor([[[-0.2, -0.4]]]))
    expected = np.log(0.5) + np.log(0.25) + np.log(2 * np.pi * np.e)
    assert float(stats["entropy"]) == pytest.approx(expected, rel=1e-5)


def test_exploration_update_follows_the_advantage_sign():
    """End to end through the learner: a critic that prefers sampled actions widens sigma."""
    algo = CTEDD(replace(CTEDDConfig(), **small()))
    learner = algo.learner
    state = torch.as_tensor(algo.runner.view.state, dtype=torch.float32)
    mean = learner.core.actor(state).detach()
    before = learner.scale(learner.core.actor.features(state)).mean().item()
    far = mean + 2.0 * before  # every sample two scales away: (eps^2 - 1) = 3 > 0
    with torch.no_grad():  # make the critic reward distance from mu: Q = sum |a| via bias
        learner.core.critic.out_bias.zero_()
    original = learner.core.critic.evaluate

    def critic_preferring_far(inputs, detach_weights=False):
        actions = inputs[..., -mean[0].numel() :]
        return actions.abs().sum(-1, keepdim=True).expand(3, -1, 1)

    learner.core.critic.evaluate = critic_preferring_far
    for _ in range(5):
        learner.exploration_update(state, far, alpha=0.0)
    learner.core.critic.evaluate = original
    after = learner.scale(learner.core.actor.features(state)).mean().item()
    algo.close()
    assert after > before


def test_distillation_loss_hand_computed():
    teacher = torch.tensor([[[1.0, 0.0], [0.5, -0.5]], [[0.0, 0.0], [1.0, 1.0]]])
    student = torch.tensor([[[0.0, 0.0], [0.5, 0.5]], [[0.5, 0.0], [1.0, 0.0]]])
    # Sample 1: |(1, 0)|^2 + |(0, -1)|^2 = 2; sample 2: 0.25 + 1 = 1.25; mean 1.625.
    assert float(distillation_loss(teacher, student)) == pytest.approx(1.625)
    student.requires_grad_(True)
    distillation_loss(teacher, student).backward()
    torch.testing.assert_close(student.grad, -(teacher - student.detach()))  # 2 diff / B


def test_local_policy_sees_others_only_through_their_messages():
    torch.manual_seed(0)
    policy = LocalPolicies(obs_dim=4, action_dim=2, num_agents=3, message_dim=1)
    obs = torch.randn(5, 3, 4)
    base = policy(obs)
    changed = obs.clone()
    changed[:, 2] += torch.randn(5, 4)  # agent 2's observation changes
    messages = policy.messages(changed)
    # With agent 2's message pinned to its old value, agents 0 and 1 act as before.
    pinned = messages.clone()
    pinned[:, 2] = policy.messages(obs)[:, 2]
    x = torch.cat([changed, policy.received(pinned)], dim=-1)
    acts = torch.tanh(policy.actor(x.transpose(0, 1))).transpose(0, 1)
    torch.testing.assert_close(acts[:, :2], base[:, :2])
    # Through the message, agent 2's observation does reach the others...
    assert not torch.allclose(policy(changed)[:, :2], base[:, :2])
    # ...and the messages are received in agent order, without one's own.
    sent = torch.arange(3.0).view(1, 3, 1)
    torch.testing.assert_close(policy.received(sent)[0], torch.tensor([[1.0, 2], [0, 2], [0, 1]]))
    # No messages: every agent acts on its own observation alone.
    silent = LocalPolicies(obs_dim=4, action_dim=2, num_agents=3, message_dim=0)
    torch.testing.assert_close(silent(changed)[:, :2], silent(obs)[:, :2])


def test_exploration_scale_starts_at_sigma_init_within_bounds():
    scale = ExplorationScale(8, 2, 3, (8,), 0.01, 1.0, 0.6)
    sigma = scale(torch.randn(10, 8))
    assert sigma.shape == (10, 3, 2)
    assert torch.allclose(sigma, torch.full_like(sigma, 0.6), atol=0.05)


def test_smoke_trains_distills_and_exports(tmp_path):
    seen = []
    result = shoal.train(
        "ctedd",
        run_dir=str(tmp_path / "run"),
        total_steps=5 * ITERATION,
        on_iteration=lambda step, metrics: seen.append(metrics),
        **small(extra_message_dims=(3,)),
    )
    assert result.env_steps == 5 * ITERATION
    learned = [m for m in seen if "loss/critic" in m]
    assert len(learned) == 4 and all(np.isfinite(m["loss/exploration"]) for m in learned)
    rounds = [m for m in seen if "distill/rows" in m]
    assert len(rounds) == 3  # at 16 and 32 env steps, and at the end (40)
    assert rounds[-1]["distill/rows"] == 5 * ITERATION  # every step so far, no autoreset yet
    for key in ("eval/global_return", "eval/local_return_m1", "eval/local_return_m3"):
        assert np.isfinite(rounds[-1][key])
    policy = shoal.load(result.run_dir)
    assert isinstance(policy.model, LocalPolicies) and policy.model.message_dim == 1
    env = shoal.make_env(policy.config.env, num_envs=2)
    actions = policy.act(env.reset(seed=0))
    env.close()
    assert actions.shape == (6, 2) and np.abs(actions).max() <= 1


def test_chronological_rows_are_oldest_first_after_wrapping():
    algo = CTEDD(
        replace(
            CTEDDConfig(), **small(**{"replay.buffer_size": 40, "replay.learning_starts": 10_000})
        )
    )
    for _ in range(9):  # 72 env steps into a 40-step buffer: it wrapped
        algo.train_iteration()
    written = algo.env_steps // algo.env.num_envs  # 18 vector steps into 10 rows
    rows = chronological_rows(algo.replay, written)
    n_obs = 3 * algo.obs_dim
    # The state's last entries hold t-independent values; use the replay order instead:
    replay, size = algo.replay, algo.replay.rows
    newest, oldest = (written - 1) % size, written % size
    np.testing.assert_array_equal(rows[-4:], replay.obs[newest][replay.valid[newest]])
    np.testing.assert_array_equal(rows[:4], replay.obs[oldest][replay.valid[oldest]])
    assert rows.shape == (replay.valid.sum(), n_obs + algo.state_dim)
    algo.close()


def test_resume_is_exact(tmp_path):
    # The split falls on a distillation round (every 16 steps) so that the shorter run's
    # final round is also one of the longer run's; alpha's horizon is fixed for the same
    # reason (by default it is run.total_steps, which the resumed run changes).
    overrides = small(
        alpha_anneal_steps=48, **{"replay.save": True, "run.checkpoint_every_steps": 4 * ITERATION}
    )
    full = shoal.train("ctedd", run_dir=str(tmp_path / "full"), total_steps=6 * ITERATION,
                       **overrides)  # fmt: skip
    checkpoints = sorted((full.run_dir / "checkpoints").glob("step_*"))
    assert len(checkpoints) == 2
    part = tmp_path / "part"
    shoal.train("ctedd", run_dir=str(part), total_steps=4 * ITERATION, **overrides)
    resumed = shoal.train(resume=str(part), total_steps=6 * ITERATION)
    a = load_checkpoint(full.checkpoint).state["algorithm"]
    b = load_checkpoint(resumed.checkpoint).state["algorithm"]
    assert_states_equal(a["learner"], b["learner"])
    assert_states_equal(a["students"], b["students"])
    assert_states_equal(a["replay"], b["replay"])
    assert a["counters"] == b["counters"]


def test_bad_configs_are_refused():
    with pytest.raises(ConfigError, match="message_dim"):
        shoal.build_config("ctedd", **{"env.kwargs": {"continuous": True, "message_dim": 1}})
    with pytest.raises(ConfigError, match="extra_message_dims"):
        shoal.build_config("ctedd", message_dim=1, extra_message_dims=(1,))
    with pytest.raises(ConfigError, match="continuous"):
        CTEDD(replace(CTEDDConfig(), **small(**{"env.kwargs": {}})))


def test_the_team_trains_against_fixed_preys_and_resumes_exactly(tmp_path):
    """Predator and Prey with learning-capable preys (a second group) that act at random:
    CTEDD trains the predators, evaluates with the same fixed preys, and resumes exactly."""
    overrides = small(
        alpha_anneal_steps=48,
        evaluate_rounds=True,
        **{"env.id": "shoal/predator-prey-v0",
           "env.kwargs": {"continuous": True, "prey": "learned"},
           "env.opponents": {"prey": "random"}, "env.max_episode_steps": 4, "replay.save": True,
           "run.checkpoint_every_steps": 4 * ITERATION},
    )  # fmt: skip
    seen = []
    full = shoal.train("ctedd", run_dir=str(tmp_path / "full"), total_steps=6 * ITERATION,
                       on_iteration=lambda step, metrics: seen.append(metrics),
                       **overrides)  # fmt: skip
    part = tmp_path / "part"
    shoal.train("ctedd", run_dir=str(part), total_steps=4 * ITERATION, **overrides)
    resumed = shoal.train(resume=str(part), total_steps=6 * ITERATION)
    a = load_checkpoint(full.checkpoint).state["algorithm"]
    b = load_checkpoint(resumed.checkpoint).state["algorithm"]
    assert_states_equal(a, b)
    logged = {key for m in seen for key in m}
    assert "eval/global_return" in logged and "episode/return/agent_0" in logged
    assert not any(key.startswith("episode/return/prey") for key in logged)  # the team's only
    with pytest.raises(ConfigError, match="--env.opponents prey random"):
        shoal.train("ctedd", run_dir=str(tmp_path / "x"), total_steps=ITERATION,
                    **small(**{"env.id": "shoal/predator-prey-v0",
                               "env.kwargs": {"continuous": True, "prey": "learned"}}))  # fmt: skip
