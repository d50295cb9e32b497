"""Ape-X: the exploration ladder, actor-side priorities and n-step cutting, replay shards,
config checks, and both variants end to end: on Ray's stand-in in this process (smoke,
checkpoints, resume, NaN losses), and on a local Ray (the run the stand-in's, crashes,
learning CartPole and Pendulum)."""

import gymnasium as gym
import numpy as np
import pytest
import torch
from in_process_ray import assert_ray_run_is_the_in_process_run
from state_helpers import assert_resume_goes_on
from torch import nn

import shoal
from shoal.algos.value.apex import (
    Apex,
    ApexActor,
    ApexDDPGConfig,
    ApexDQNConfig,
    ddpg_priorities,
    dqn_priorities,
    exploration_scales,
    per_worker_epsilons,
    variant,
)
from shoal.config import NoiseConfig, RenamedFieldWarning, RunConfig, replace
from shoal.core.errors import ConfigError, NaNLossError
from shoal.core.types import ReplayBatch
from shoal.data.replay_shard import ReplayShard
from shoal.losses.value_kinds import ExpectedQ
from shoal.train.checkpoint import load_checkpoint

QUIET = {
    "run.eval_every_steps": 0,
    "run.checkpoint_every_steps": 0,
    "run.console": False,
    "run.tensorboard": False,
}

# 2 actors x 2 envs x 8 steps; the learner keeps 4 replayed transitions per env step.
APEX = {
    "run.runners": 2,
    "replay_shards": 2,
    "env.num_envs": 2,
    "rollout_steps": 8,
    "steps_per_iteration": 64,
    "weight_sync_every": 2,
    "training_intensity": 4.0,
    **QUIET,
}
LEARNER = {
    "replay.n_step": 2,
    "replay.batch_size": 16,
    "replay.learning_starts": 32,
    "replay.buffer_size": 500,
    "model.hidden": (16,),
}


def small(block: str = "dqn", **extra) -> dict:
    """The settings above, the learner's in its block (dqn or ddpg)."""
    return {**APEX, **{f"{block}.{k}": v for k, v in LEARNER.items()}, **extra}


SMALL = small()


def test_per_worker_epsilons_follow_the_paper():
    # eps_i = 0.4 ** (1 + i / (N - 1) * 7): 0.4, 0.4 ** 4.5 = 0.0256 * sqrt(0.4), 0.4 ** 8.
    assert per_worker_epsilons(3) == pytest.approx([0.4, 0.0256 * 0.6324555320, 0.00065536])
    assert per_worker_epsilons(1) == [0.4]
    assert per_worker_epsilons(2, epsilon=0.5, alpha=1.0) == pytest.approx([0.5, 0.25])


def test_exploration_scales_per_variant():
    dqn_config = ApexDQNConfig(run=RunConfig(runners=3))
    assert exploration_scales(dqn_config, variant(dqn_config)) == pytest.approx(
        [0.4, 0.016190869, 0.00065536]
    )
    flat = replace(dqn_config, per_worker_exploration=False, exploration_epsilon=0.1)
    assert exploration_scales(flat, variant(flat)) == pytest.approx([0.1, 0.1, 0.1])
    # DDPG: noise.scale times eps_i / eps = 0.4 ** (i / (N - 1) * alpha); 0.3 * 0.4 ** 3.
    ddpg_config = ApexDDPGConfig(run=RunConfig(runners=2))
    assert ddpg_config.ddpg.noise == NoiseConfig(kind="gaussian", scale=0.3)
    assert exploration_scales(ddpg_config, variant(ddpg_config)) == pytest.approx([0.3, 0.0192])


def transitions(obs):
    n = len(obs)
    return ReplayBatch(
        obs=torch.tensor(obs, dtype=torch.float32).view(n, 1),
        actions=torch.arange(n) % 2,
        rewards=torch.ones(n, 2),
        steps=torch.full((n,), 2),
        terminated=torch.zeros(n, dtype=torch.bool),
        next_obs=torch.tensor(obs, dtype=torch.float32).view(n, 1) + 1,
        next_action_mask=None,
        weights=torch.ones(n),
        indices=np.arange(n),
    )


def test_shard_adds_samples_and_updates_priorities():
    shard = ReplayShard(6, gym.spaces.Box(-9, 9, (1,)), gym.spaces.Discrete(2), 2, alpha=1.0)
    assert shard.sample_many(2, 4, 0.5) == []
    assert shard.add(transitions([0, 1, 2, 3]), np.array([1.0, 2.0, 3.0, 4.0])) == 4
    # alpha 1: sampling mass p + eps; importance weight (N P(i)) ** -beta over the batch max.
    np.testing.assert_allclose(shard.priorities.tree.get(np.arange(4)), [1, 2, 3, 4], 1e-5)
    batch = shard.sample(32, beta=0.5)
    p = 1.0 + batch.obs[:, 0].numpy()  # slot i holds obs i, priority i + 1
    weights = (4 * p / 10.0) ** -0.5
    np.testing.assert_allclose(batch.weights.numpy(), weights / weights.max(), rtol=1e-5)
    np.testing.assert_array_equal(batch.next_obs.numpy(), batch.obs.numpy() + 1)
    assert batch.rewards.shape == (32, 2) and (batch.steps == 2).all()
    shard.update_priorities(np.array([0, 3]), np.array([5.0, 0.5]))
    np.testing.assert_allclose(shard.priorities.tree.get(np.arange(4)), [5, 2, 3, 0.5], 1e-5)
    # Four more wrap around: slots 4, 5, 0, 1 take them; the running max (5) starts them.
    assert shard.add(transitions([10, 11, 12, 13])) == 6
    np.testing.assert_array_equal(shard.obs[:, 0], [12, 13, 2, 3, 10, 11])
    np.testing.assert_allclose(shard.priorities.tree.get(np.arange(6)), [5, 5, 3, 0.5, 5, 5], 1e-5)
    assert shard.priorities.num_active == 6
    copy = ReplayShard(6, gym.spaces.Box(-9, 9, (1,)), gym.spaces.Discrete(2), 2, alpha=1.0)
    copy.load_state_dict(shard.state_dict())
    np.testing.assert_array_equal(copy.sample(8, 0.4).indices, shard.sample(8, 0.4).indices)


class TableQ(nn.Module):
    """Q(s, a) = table[a] whatever s: TD errors by hand."""

    kind = ExpectedQ("huber")

    def forward(self, obs):
        return torch.tensor([1.0, 2.0]).expand(obs.shape[0], 2).unsqueeze(-1)


def test_dqn_priorities_by_hand():
    batch = ReplayBatch(
        obs=torch.zeros(2, 3),
        actions=torch.tensor([0, 1]),
        rewards=torch.tensor([[1.0, 1.0], [1.0, 0.0]]),
        steps=torch.tensor([2, 1]),
        terminated=torch.tensor([False, True]),
        next_obs=torch.zeros(2, 3),
        next_action_mask=None,
        weights=torch.ones(2),
        indices=np.arange(2),
    )
    config = replace(ApexDQNConfig(), **{"dqn.gamma": 0.5})
    inner = variant(config).inner
    # 1 + 0.5 * 1 + 0.25 * max(1, 2) = 2 against Q = 1; terminated: 1 against Q = 2.
    np.testing.assert_allclose(dqn_priorities(TableQ(), batch, inner).numpy(), [1.0, 1.0])


class SumCritic(nn.Module):
    """Q(s, a) = sum(s) + sum(a), shaped [members=1, N, 1]."""

    def forward(self, obs, actions):
        return (obs.sum(-1) + actions.sum(-1)).view(1, -1, 1)


class ZeroActor(nn.Module):
    class scaler:  # noqa: N801 - stands in for ActionScaler
        @staticmethod
        def to_unit(actions):
            return actions

    def forward(self, obs):
        return torch.zeros(obs.shape[0], 1)


def test_ddpg_priorities_by_hand():
    batch = ReplayBatch(
        obs=torch.tensor([[1.0, 2.0]]),
        actions=torch.tensor([[0.5]]),
        rewards=torch.tensor([[1.0, 0.0]]),
        steps=torch.tensor([1]),
        terminated=torch.tensor([False]),
        next_obs=torch.tensor([[3.0, 0.0]]),
        next_action_mask=None,
        weights=torch.ones(1),
        indices=np.arange(1),
    )
    config = replace(ApexDDPGConfig(), **{"ddpg.gamma": 0.9})
    inner = variant(config).inner
    # target 1 + 0.9 * (3 + 0) = 3.7; Q = 3 + 0.5 = 3.5 -> |0.2|
    priorities = ddpg_priorities(ZeroActor(), SumCritic(), batch, inner)
    np.testing.assert_allclose(priorities.numpy(), [0.2], rtol=1e-5)


def test_actor_cuts_every_step_once_into_n_step_windows():
    config = replace(ApexDQNConfig(rollout_steps=5), **{"dqn.replay.n_step": 3})
    actor = ApexActor(config, 1, variant(config))
    assert actor.scale == pytest.approx(0.4**8)
    assert actor.model.epsilon.item() == pytest.approx(0.4**8)
    envs = actor.runner.num_envs
    cut, steps, episodes = 0, 0, 0
    for _ in range(4):
        batch, priorities, finished, count = actor.sample()
        steps += count
        episodes += len(finished.returns)
        cut += len(batch.steps)
        assert batch.rewards.shape[1] == 3 and ((batch.steps >= 1) & (batch.steps <= 3)).all()
        assert priorities.shape == (len(batch.steps),) and (priorities >= 0).all()
        np.testing.assert_allclose(
            priorities, dqn_priorities(actor.model, batch, actor.parts.inner)
        )
    # Rows 0..16 of 20 are cut (the newest n = 3 wait for their window), less the autoreset
    # rows (not steps), one after each finished episode.
    assert steps == 20 * envs
    assert 17 * envs - episodes <= cut <= 17 * envs
    weights = {k: v.clone() for k, v in actor.model.state_dict().items()}
    weights["epsilon"].fill_(1.0)
    actor.set_weights({"model": weights})
    assert actor.model.epsilon.item() == pytest.approx(0.4**8)  # its own, not the learner's


def test_ddpg_actor_scales_its_noise_and_scores_with_its_critic():
    config = replace(ApexDDPGConfig(rollout_steps=8), **{"ddpg.replay.n_step": 2})
    actor = ApexActor(config, 1, variant(config))
    assert actor.model.noise.scale == pytest.approx(0.3 * 0.4**3)
    batch, priorities, _, count = actor.sample(random_actions=True)
    assert count == 8 and len(batch.steps) == 6  # Pendulum never ends within 8 steps
    rescored = ddpg_priorities(actor.model, actor.critic, batch, actor.parts.inner)
    np.testing.assert_allclose(priorities, rescored.numpy())
    unscored_config = replace(config, worker_side_prioritization=False)
    unscored = ApexActor(unscored_config, 0, variant(unscored_config))
    assert unscored.critic is None and unscored.sample()[1] is None


def test_unsupported_action_space_fails_before_starting_actors():
    with pytest.raises(shoal.core.errors.UnsupportedSpaceError, match="Discrete"):
        Apex(replace(ApexDQNConfig(), **{"env.id": "Pendulum-v1"}))


@pytest.mark.parametrize(
    "field, value",
    [
        ("dqn.replay.batch_size", 0),
        ("dqn.replay.n_step", 0),
        ("replay_shards", 0),
        ("dqn.gamma", 1.5),
        ("dqn.replay.priority_beta", 2.0),
        ("exploration_epsilon", 0.0),
        ("training_intensity", -1.0),
        ("dqn.replay.learning_starts", 10**9),
        ("dqn.replay.prioritized", "rank"),
        ("dqn.target_update_every", 0),
        ("dqn.loss", "l1"),
    ],
)
def test_bad_config_values_name_the_field(field, value):
    with pytest.raises(ConfigError, match=field.split(".")[-1]):
        replace(ApexDQNConfig(), **{field: value})


def test_old_flat_fields_land_in_the_learner_block():
    with pytest.warns(RenamedFieldWarning) as caught:
        config = replace(ApexDQNConfig(), n_step=4, batch_size=32, **{"optim.lr": 0.01})
    assert "config field 'n_step' is now 'dqn.replay.n_step' (the old name still works)" in [
        str(w.message) for w in caught
    ]
    assert config.dqn.replay.n_step == 4 and config.dqn.replay.batch_size == 32
    assert config.dqn.optim.lr == 0.01 and config.dqn.optim.max_grad_norm == 40.0
    with pytest.warns(RenamedFieldWarning, match="'noise' is now 'ddpg.noise'"):
        config = shoal.config.from_dict(ApexDDPGConfig, {"noise": {"scale": 0.5}})
    with pytest.warns(RenamedFieldWarning) as caught:
        config = shoal.config.from_dict(ApexDDPGConfig, {"noise": {"scale": 0.5}, "tau": 0.01})
    assert len(caught) == 2
    assert config.ddpg.noise.scale == 0.5 and config.ddpg.tau == 0.01


def test_config_needs_ray_actors_and_no_normalization():
    with pytest.raises(ConfigError, match="run.runners"):
        replace(ApexDQNConfig(), **{"run.runners": 0})
    with pytest.raises(ConfigError, match="normalize"):
        replace(ApexDQNConfig(), **{"env.normalize_obs": True})
    with pytest.raises(ConfigError, match="tau"):
        replace(ApexDDPGConfig(), **{"ddpg.tau": 0.0})
    assert shoal.registry.get_algorithm("apex-dqn").default_config().run.runners == 2


def test_apex_dqn_smoke_checkpoint_and_resume(in_process_ray, tmp_path):
    seen = []
    result = shoal.train(
        "apex-dqn",
        run_dir=str(tmp_path / "run"),
        total_steps=3 * 64,
        on_iteration=lambda step, metrics: seen.append(metrics),
        **SMALL,
    )
    assert result.env_steps >= 3 * 64 and result.iterations == 3
    last = seen[-1]
    assert last["train/grad_steps"] > 0 and np.isfinite(last["loss/td"])
    assert last["train/epsilon_mean"] == pytest.approx((0.4 + 0.4**8) / 2)
    # The throttle keeps the learner at 4 replayed transitions per env step after the start.
    assert last["train/grad_steps"] * 16 >= 4 * (result.env_steps - 32 - 4 * 32)
    policy = shoal.load(result.run_dir)
    assert policy.act(np.zeros((3, 4), np.float32)).shape == (3,)
    assert assert_resume_goes_on(result.run_dir, 6 * 64).iterations == 6


def test_apex_ddpg_smoke_checkpoint_and_resume(in_process_ray, tmp_path):
    seen = []
    result = shoal.train(
        "apex-ddpg",
        run_dir=str(tmp_path / "ddpg"),
        total_steps=3 * 64,
        on_iteration=lambda step, metrics: seen.append(metrics),
        **small("ddpg", replay_shards=1, rollout_steps=16, **{"env.num_envs": 1}),
    )
    assert result.env_steps >= 3 * 64
    last = seen[-1]
    assert np.isfinite(last["loss/critic"]) and np.isfinite(last["loss/actor"])
    assert last["train/noise_scale_mean"] == pytest.approx((0.3 + 0.3 * 0.4**3) / 2)
    action = shoal.load(result.run_dir).act(np.zeros((2, 3), np.float32))
    assert action.shape == (2, 1) and (np.abs(action) <= 2.0).all()
    assert_resume_goes_on(result.run_dir, 6 * 64)


@pytest.mark.parametrize(
    ("algo", "overrides"),
    [("apex-dqn", SMALL),
     ("apex-ddpg", small("ddpg", replay_shards=1, rollout_steps=16, **{"env.num_envs": 1}))],
)  # fmt: skip
def test_a_learner_group_trains_on_the_shards_batches_and_resumes(
    in_process_ray, forked_learners, tmp_path, algo, overrides
):
    """``run.learners 2``: the learner is a group of two (forked) ranks, each taking half of
    every batch the shards send; the priorities go back to the shards, the actors get the
    group's weights (DDPG's critic too), and the run resumes from the group's checkpoint."""
    seen = []
    result = shoal.train(
        algo,
        run_dir=str(tmp_path / "run"),
        total_steps=3 * 64,
        on_iteration=lambda step, metrics: seen.append(metrics),
        **{**overrides, "run.learners": 2},
    )
    last = seen[-1]
    assert last["train/grad_steps"] > 0
    assert all(np.isfinite(v) for k, v in last.items() if k.startswith("loss/"))
    assert "group_rng" in load_checkpoint(result.run_dir).state["algorithm"]["learner"]
    assert assert_resume_goes_on(result.run_dir, 6 * 64).iterations == 6


@pytest.mark.parametrize(
    ("algo", "overrides"),
    [("apex-dqn", SMALL), ("apex-ddpg", small("ddpg", replay_shards=1, **{"env.num_envs": 1}))],
)
def test_results_in_turn_make_the_ray_run_the_in_process_one(
    ray_session, tmp_path, monkeypatch, algo, overrides
):
    """Actor and replay batches taken in request order: actors, shards and the learner run
    at once on Ray, yet the run ends in the state, bit for bit, and logs the metrics of the
    same seed's run with its workers called one after another in this process."""
    overrides = {**overrides, "results_in_turn": True}
    _, rows = assert_ray_run_is_the_in_process_run(
        tmp_path, monkeypatch, algo, 4 * 64, seed=3, **overrides
    )
    assert rows[-1]["train/grad_steps"] > 0


def test_crashed_actor_and_shard_restart_and_training_goes_on(ray_session):
    algo = Apex(replace(ApexDQNConfig(), **SMALL))
    try:
        algo.train_iteration()
        algo.actors.kill(0)
        algo.shards.kill(1)
        # Both are dead as far as Ray knows (`kill` waits for that); the learner finds each
        # crash when it takes a result of that worker, within a few iterations (results are
        # taken fastest first); then training must go on with both restarted.
        for _ in range(30):
            metrics = algo.train_iteration()
            if metrics["train/actor_restarts"] and metrics["train/shard_restarts"]:
                break
        assert metrics["train/actor_restarts"] == 1
        assert metrics["train/shard_restarts"] == 1
        for _ in range(2):
            metrics = algo.train_iteration()
        assert metrics["train/actor_restarts"] == 1 and metrics["train/shard_restarts"] == 1
        assert np.isfinite(metrics["loss/td"])
    finally:
        algo.close()


def test_nan_loss_raises_naming_the_loss(in_process_ray):
    algo = Apex(replace(ApexDQNConfig(), **SMALL))
    try:
        with torch.no_grad():
            next(algo.learner.online.parameters()).fill_(float("nan"))
        with pytest.raises(NaNLossError, match="loss/td"):
            for _ in range(5):
                algo.train_iteration()
    finally:
        algo.close()


@pytest.mark.learning
def test_apex_dqn_learns_cartpole(ray_session, tmp_path):
    """Tuned apex-dqn-cartpole (2 actors, 1 shard) on seed 0 until the deterministic
    evaluation (10 episodes, every 2048 env steps) reaches 150, within 60k env steps.
    Results are taken in request order, so the run is the same however actors and learner
    are timed: seed 0 reaches 190.8 at 24,576 env steps every time (43-50 s on 2 shared
    cores, Ray start included; seeds 1 and 2 at 24,576 and 20,480). Taken as they arrived,
    seed 0 passed 150 after anything from 4k to 31k env steps."""
    evals = []

    def record(step, metrics):
        if "eval/return" in metrics:
            evals.append((step, round(metrics["eval/return"], 1)))

    result = shoal.train(
        tuned="apex-dqn-cartpole",
        seed=0,
        run_dir=str(tmp_path / "learn"),
        total_steps=60_000,
        target_return=150.0,
        on_iteration=record,
        results_in_turn=True,
        **{"run.eval_episodes": 10, "run.console": False, "run.tensorboard": False},
    )
    assert result.eval_return is not None and result.eval_return >= 150.0, evals


@pytest.mark.learning
def test_apex_ddpg_swings_pendulum_up(ray_session, tmp_path):
    """Tuned apex-ddpg-pendulum (2 actors, 1 shard) on seed 0 until the deterministic
    evaluation (10 episodes, every 1,000 env steps) reaches -200, within its 30k env steps
    (random actions score about -1,200). Results are taken in request order, so the run is
    the same however actors and learner are timed: seed 0 reaches -173.9 at 4,096 env steps
    every time (33-39 s on 2 shared cores; seed 1: -152.1 at 5,120)."""
    evals = []

    def record(step, metrics):
        if "eval/return" in metrics:
            evals.append((step, round(metrics["eval/return"], 1)))

    result = shoal.train(tuned="apex-ddpg-pendulum", seed=0, run_dir=str(tmp_path / "learn"),
                         on_iteration=record, results_in_turn=True,
                         **{"run.console": False, "run.tensorboard": False})  # fmt: skip
    assert result.eval_return is not None and result.eval_return >= -200.0, evals
