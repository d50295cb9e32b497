"""DDPG, TD3, SAC and D4PG end to end on tiny settings: smoke runs, exploration, delayed
updates, bad input and exact resume."""

import gymnasium as gym
import numpy as np
import pytest
import torch
from state_helpers import assert_states_equal, metric_rows

import shoal
from shoal.algos.continuous.ddpg import DDPG
from shoal.algos.continuous.sac import SAC, SACConfig
from shoal.algos.continuous.td3 import TD3, TD3Config, TD3Learner
from shoal.config import EnvConfig, ModelConfig, ReplayConfig
from shoal.core.errors import ConfigError, NaNLossError, UnsupportedSpaceError
from shoal.train.checkpoint import load_checkpoint

ALGOS = ["ddpg", "td3", "sac", "d4pg"]
# 2 envs x 4 steps = 8 env steps per iteration, learning from the second iteration on.
ITERATION = 8


def small(**extra):
    overrides = {
        "env.id": "Pendulum-v1",
        "env.num_envs": 2,
        "rollout_steps": 4,
        "replay.gradient_steps": 2,
        "replay.batch_size": 8,
        "replay.learning_starts": ITERATION,
        "replay.buffer_size": 200,
        "model.hidden": (16,),
        "run.eval_every_steps": 0,
        "run.checkpoint_every_steps": 0,
        "run.console": False,
        "run.tensorboard": False,
    }
    overrides.update(extra)
    return overrides


VARIANTS = {
    "ddpg": {},
    "ddpg_gaussian_nstep_per_huber_l2": {
        "noise.kind": "gaussian",
        "replay.n_step": 3,
        "replay.prioritized": "proportional",
        "critic_loss": "huber",
        "critic_l2": 1e-2,
    },
    "td3": {},
    "td3_rank_grad_clip": {"replay.prioritized": "rank", "optim.max_grad_norm": 1.0},
    "sac": {},
    "sac_fixed_alpha": {"learn_alpha": False, "init_alpha": 0.1},
    "d4pg": {"num_atoms": 11, "v_min": -50.0, "v_max": 0.0},
    "d4pg_prioritized": {"replay.prioritized": "proportional", "num_atoms": 11},
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_smoke_on_pendulum(variant, tmp_path):
    algo = variant.split("_")[0]
    seen = []
    result = shoal.train(
        algo,
        run_dir=str(tmp_path / variant),
        total_steps=4 * ITERATION,
        on_iteration=lambda step, metrics: seen.append(metrics),
        **small(**VARIANTS[variant]),
    )
    assert result.env_steps == 4 * ITERATION
    learned = [m for m in seen if "loss/critic" in m]
    assert len(learned) == 3  # no learning during the first (random-action) iteration
    assert learned[-1]["train/grad_steps"] == 6
    for metrics in learned:
        assert np.isfinite(metrics["loss/critic"]) and np.isfinite(metrics["loss/actor"])

    # The saved policy acts inside the env's bounds through the public loading path.
    policy = shoal.load(result.run_dir)
    actions = policy.act(np.zeros((5, 3), np.float32))
    assert actions.shape == (5, 1)
    assert np.all(np.abs(actions) <= 2.0)


def test_discrete_sac_on_cartpole(tmp_path):
    seen = []
    result = shoal.train(
        "sac",
        run_dir=str(tmp_path / "d"),
        total_steps=4 * ITERATION,
        on_iteration=lambda step, metrics: seen.append(metrics),
        **small(**{"env.id": "CartPole-v1"}),
    )
    assert result.env_steps == 4 * ITERATION
    assert np.isfinite(seen[-1]["loss/critic"])
    # The target entropy of discrete SAC is 0.98 log |A| (Christodoulou 2019).
    algo = SAC(shoal.build_config("sac", **small(**{"env.id": "CartPole-v1"})))
    try:
        assert algo.learner.target_entropy == pytest.approx(0.98 * np.log(2))
    finally:
        algo.close()
    policy = shoal.load(result.run_dir)
    assert set(policy.act(np.zeros((4, 4), np.float32)).tolist()) <= {0, 1}


@pytest.mark.parametrize("algo", ALGOS)
def test_smoke_on_mujoco(algo, tmp_path):
    pytest.importorskip("mujoco", reason="needs the mujoco extra: pip install 'shoal[mujoco]'")
    result = shoal.train(
        algo,
        run_dir=str(tmp_path / algo),
        total_steps=3 * ITERATION,
        **small(**{"env.id": "Hopper-v5"}),
    )
    assert result.env_steps == 3 * ITERATION
    actions = shoal.load(result.run_dir).act(np.zeros((2, 11), np.float32))
    assert actions.shape == (2, 3) and np.all(np.abs(actions) <= 1.0)


def test_random_actions_until_learning_starts_then_the_actor():
    config = shoal.build_config("td3", **small(**{"replay.learning_starts": 2 * ITERATION}))
    algo = TD3(config)
    try:
        algo.train_iteration()
        algo.train_iteration()
        assert not algo.learner.core.grad_steps
        first = algo.replay.actions[:8].copy()  # uniform over [-2, 2]
        assert np.abs(first).max() > 0.5
        algo.train_iteration()  # acts with the (barely trained) actor plus N(0, 0.1) noise
        assert not bool(algo.sampler.runner.model.random_actions)
        obs = torch.as_tensor(algo.replay.obs[8:12]).reshape(-1, 3)
        greedy = algo.sampler.runner.model.greedy(obs).numpy()  # the weights it acted with
        noise = algo.replay.actions[8:12].reshape(-1, 1) - greedy
        # Noise of std 0.1 in the unit box is std 0.2 in Pendulum's [-2, 2]; clipped at bounds.
        assert np.abs(noise).max() < 1.2
    finally:
        algo.close()


def test_td3_delays_actor_and_target_updates():
    obs_space, action_space = gym.spaces.Box(-1, 1, (3,)), gym.spaces.Box(-2, 2, (1,))
    config = TD3Config(
        model=ModelConfig(hidden=(8,)), policy_delay=2, replay=ReplayConfig(batch_size=4)
    )
    learner = TD3Learner(config, obs_space, action_space)
    core = learner.core
    from shoal.core.types import ReplayBatch

    batch = ReplayBatch(
        obs=torch.randn(4, 3),
        actions=torch.rand(4, 1) * 4 - 2,
        rewards=torch.randn(4, 1),
        steps=torch.ones(4, dtype=torch.int64),
        terminated=torch.zeros(4, dtype=torch.bool),
        next_obs=torch.randn(4, 3),
        next_action_mask=None,
        weights=torch.ones(4),
        indices=np.arange(4),
    )

    def snapshot(module):
        return [p.detach().clone() for p in module.parameters()]

    actor, critic = snapshot(core.actor), snapshot(core.critic)
    target_actor, target_critic = snapshot(core.target_actor), snapshot(core.target_critic)
    learner.update(batch)  # step 1: critic only
    assert all(torch.equal(a, b) for a, b in zip(actor, snapshot(core.actor), strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(critic, snapshot(core.critic), strict=True))
    unchanged = zip(target_critic, snapshot(core.target_critic), strict=True)
    assert all(torch.equal(a, b) for a, b in unchanged)
    learner.update(batch)  # step 2: critic, actor and targets
    assert not all(torch.equal(a, b) for a, b in zip(actor, snapshot(core.actor), strict=True))
    moved = zip(target_actor, snapshot(core.target_actor), strict=True)
    assert not all(torch.equal(a, b) for a, b in moved)


def test_ou_noise_is_correlated_in_time():
    config = shoal.build_config("ddpg", **small(**{"env.num_envs": 1, "noise.scale": 1.0}))
    algo = DDPG(config)
    try:
        actor = algo.sampler.runner.model
        actor.random_actions.fill_(False)
        obs = torch.zeros(1, 3)
        greedy = actor.greedy(obs)
        steps = torch.stack([actor.explore(obs) - greedy for _ in range(2000)]).flatten()
        steps = steps[(steps.abs() < 1.9)]  # away from the clipped bounds
        lag1 = np.corrcoef(steps[:-1].numpy(), steps[1:].numpy())[0, 1]
        assert lag1 > 0.6  # about 1 - theta = 0.85 for an unclipped process
    finally:
        algo.close()


def test_unbounded_and_unsupported_action_spaces_are_refused(tmp_path, registered_env):
    class Unbounded(gym.Env):
        observation_space = gym.spaces.Box(-1, 1, (2,))
        action_space = gym.spaces.Box(-np.inf, np.inf, (1,))

        def reset(self, *, seed=None, options=None):
            return np.zeros(2, np.float32), {}

        def step(self, action):
            return np.zeros(2, np.float32), 0.0, False, False, {}

    env_id = registered_env("shoal-test/Unbounded-v0", Unbounded)
    for algo in ALGOS:
        with pytest.raises(UnsupportedSpaceError, match="unbounded"):
            shoal.train(algo, run_dir=str(tmp_path / algo), **small(**{"env.id": env_id}))
    with pytest.raises(UnsupportedSpaceError, match="1-D Box"):
        shoal.train("td3", run_dir=str(tmp_path / "c"), **small(**{"env.id": "CartPole-v1"}))


@pytest.mark.parametrize(
    ("algo", "field", "value"),
    [
        ("ddpg", "tau", 0.0),
        ("ddpg", "noise.kind", "pink"),
        ("td3", "policy_delay", 0),
        ("sac", "init_alpha", -1.0),
        ("d4pg", "v_max", -200.0),
        ("sac", "critic_loss", "l1"),
    ],
)
def test_bad_config_values_name_the_field(algo, field, value):
    with pytest.raises(ConfigError, match=field.split(".")[-1]):
        shoal.build_config(algo, **{field: value})


def test_nan_in_the_critic_is_refused_before_any_weight_changes():
    config = SACConfig(
        env=EnvConfig(id="Pendulum-v1", num_envs=2),
        model=ModelConfig(hidden=(8,)),
        rollout_steps=4,
        replay=ReplayConfig(learning_starts=4, batch_size=4),
    )
    algo = SAC(config)
    try:
        algo.train_iteration()
        with torch.no_grad():
            next(algo.learner.core.critic.parameters()).fill_(float("nan"))
        before = algo.learner.core.actor.state_dict()
        with pytest.raises(NaNLossError, match="loss"):
            algo.train_iteration()
        assert_states_equal(algo.learner.core.actor.state_dict(), before)
    finally:
        algo.close()


@pytest.mark.parametrize(
    ("algo", "extra"),
    [
        ("sac", {}),
        (
            "ddpg",
            {"replay.prioritized": "proportional", "replay.n_step": 2},
        ),  # OU noise state is checkpointed
        ("td3", {}),
        ("d4pg", {"num_atoms": 11}),
    ],
)
def test_resume_with_saved_replay_is_exact(algo, extra, tmp_path):
    first, total = 3 * ITERATION, 6 * ITERATION
    overrides = small(
        **{
            "replay.save": True,
            "run.checkpoint_every_steps": ITERATION,
            "optim.anneal_steps": total,
        },
        **extra,
    )
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    part = shoal.train(algo, seed=3, total_steps=first, run_dir=a, **overrides)
    resumed = shoal.train(resume=part.run_dir, total_steps=total)
    straight = shoal.train(algo, seed=3, total_steps=total, run_dir=b, **overrides)
    got = load_checkpoint(resumed.run_dir).state
    want = load_checkpoint(straight.run_dir).state
    assert_states_equal(got["algorithm"], want["algorithm"])
    assert metric_rows(resumed.run_dir) == metric_rows(straight.run_dir)
