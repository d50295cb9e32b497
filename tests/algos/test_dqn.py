"""DQN end to end on tiny settings: every Rainbow switch, QR-DQN, REM, masks, checkpoints."""

import gymnasium as gym
import numpy as np
import pytest
import torch
from state_helpers import assert_states_equal, metric_rows

import shoal
from shoal.algos.value.dqn import DQN, DQNConfig, DQNLearner
from shoal.config import EnvConfig, ModelConfig, ReplayConfig, RunConfig, replace
from shoal.core.errors import ConfigError, NaNLossError, UnsupportedSpaceError
from shoal.losses.value_kinds import make_value_kind
from shoal.nn.q_network import GreedyDistribution, QNetwork
from shoal.train.checkpoint import load_checkpoint

# 2 envs x 8 steps = 16 env steps per iteration, learning from the second iteration on.
ITERATION = 16


def small(**extra):
    overrides = {
        "env.num_envs": 2,
        "rollout_steps": 8,
        "replay.gradient_steps": 2,
        "replay.batch_size": 8,
        "replay.learning_starts": ITERATION,
        "replay.buffer_size": 200,
        "target_update_every": 3,
        "exploration_steps": 4 * ITERATION,
        "model.hidden": (16,),
        "run.eval_every_steps": 0,
        "run.checkpoint_every_steps": 0,
        "run.console": False,
        "run.tensorboard": False,
    }
    overrides.update(extra)
    return overrides


RAINBOW = {
    "double_q": True,
    "dueling": True,
    "replay.n_step": 3,
    "replay.prioritized": "proportional",
    "noisy": True,
    "value_head": "c51",
    "epsilon_start": 0.0,
    "epsilon_end": 0.0,
    "head_hidden": 8,
}

# Each Rainbow switch alone, their combination, and the other heads and options.
SWITCHES = {
    "plain": {"double_q": False},
    "double": {},
    "dueling": {"dueling": True},
    "n_step": {"replay.n_step": 3},
    "proportional": {"replay.prioritized": "proportional"},
    "rank": {"replay.prioritized": "rank"},
    "noisy": {"noisy": True, "epsilon_start": 0.0, "epsilon_end": 0.0},
    "c51": {"value_head": "c51", "num_atoms": 11},
    "rainbow": RAINBOW,
    "quantile": {"value_head": "quantile", "num_quantiles": 8},
    "rem": {"value_head": "rem", "num_heads": 3},
    "mse_soft_target": {"loss": "mse", "tau": 0.05, "target_update_every": 1},
    "boltzmann": {"exploration": "boltzmann"},
}


@pytest.mark.parametrize("name", list(SWITCHES))
def test_smoke_every_switch(name, tmp_path):
    seen = []
    result = shoal.train(
        "dqn",
        run_dir=str(tmp_path / name),
        total_steps=3 * ITERATION,
        on_iteration=lambda step, metrics: seen.append(metrics),
        **small(**SWITCHES[name]),
    )
    assert result.env_steps == 3 * ITERATION
    assert "loss/td" not in seen[0]  # still before learning_starts
    learned = seen[-1]
    assert np.isfinite(learned["loss/td"]) and np.isfinite(learned["train/q_mean"])
    assert learned["train/grad_steps"] == 4
    state = load_checkpoint(result.run_dir).state["algorithm"]
    policy = shoal.load(result.run_dir)
    actions = policy.act(np.zeros((3, 4), np.float32))
    assert actions.shape == (3,) and actions.dtype == np.int64
    assert set(state) >= {"learner", "sampler", "policy", "counters"}


RAINBOW_PARTS = {
    "double_q": ({"double_q": False}, {"double_q": True}),
    "dueling": ({}, {"dueling": True}),
    "n_step": ({}, {"replay.n_step": 3}),
    "prioritized": ({}, {"replay.prioritized": "proportional"}),
    "noisy": ({}, {"noisy": True, "epsilon_start": 0.0, "epsilon_end": 0.0}),
    "c51": ({}, {"value_head": "c51", "num_atoms": 11}),
}


@pytest.mark.parametrize("combination", range(2 ** len(RAINBOW_PARTS)))
def test_every_combination_of_rainbow_parts_learns_without_error(combination):
    """All 64 on/off combinations of Rainbow's six parts: two learning iterations each."""
    fields = {}
    for bit, (off, on) in enumerate(RAINBOW_PARTS.values()):
        fields.update(on if combination >> bit & 1 else off)
    base = DQNConfig(
        env=EnvConfig(num_envs=2), model=ModelConfig(hidden=(8,)), rollout_steps=8,
        replay=ReplayConfig(learning_starts=16, batch_size=4, gradient_steps=2, buffer_size=64),
    )  # fmt: skip
    config = replace(base, **fields)
    algo = DQN(config)
    try:
        for _ in range(3):
            metrics = algo.train_iteration()
        assert metrics["train/grad_steps"] == 4
        assert np.isfinite(metrics["loss/td"]), fields
        assert ("train/beta" in metrics) == (config.replay.prioritized == "proportional")
    finally:
        algo.close()


def test_epsilon_anneals_and_travels_to_the_sampler():
    config = DQNConfig(
        env=EnvConfig(num_envs=2), model=ModelConfig(hidden=(8,)), rollout_steps=4,
        replay=ReplayConfig(learning_starts=10**6), exploration_steps=32, epsilon_start=1.0,
        epsilon_end=0.1,
    )  # fmt: skip
    algo = DQN(config)
    try:
        eps = [algo.train_iteration()["train/epsilon"] for _ in range(5)]
        assert eps == pytest.approx([1.0, 0.775, 0.55, 0.325, 0.1])
        assert algo.sampler.runner.model.epsilon.item() == pytest.approx(0.1)
    finally:
        algo.close()


def q_network(**fields):
    config = DQNConfig(model=ModelConfig(hidden=(8,)), **fields)
    import gymnasium as gym

    return QNetwork(
        gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(4), config, make_value_kind(config)
    )


def test_epsilon_greedy_respects_masks_and_epsilon():
    torch.manual_seed(0)
    net = q_network()
    obs = torch.zeros(4000, 3)
    mask = torch.zeros(4000, 4, dtype=torch.bool)
    mask[:, 1:3] = True
    net.epsilon.fill_(1.0)
    random = net.act(obs, action_mask=mask).actions
    assert set(random.tolist()) == {1, 2}
    assert abs((random == 1).float().mean().item() - 0.5) < 0.05
    net.epsilon.fill_(0.0)
    greedy = net.act(obs[:5], action_mask=mask[:5]).actions
    q = net.q_values(obs[:5])
    assert torch.equal(greedy, q[:, 1:3].argmax(-1) + 1)


def test_boltzmann_sampling_follows_softmax_of_q_over_temperature():
    torch.manual_seed(1)
    net = q_network(exploration="boltzmann")
    q = torch.tensor([[0.0, 1.0, 2.0, -30.0]]).repeat(20000, 1)
    net.temperature.fill_(2.0)
    actions = GreedyDistribution(net, q, None).sample()
    freq = torch.bincount(actions, minlength=4).float() / len(actions)
    torch.testing.assert_close(freq, torch.softmax(q[0] / 2.0, -1), atol=0.01, rtol=0)


def test_action_masks_from_info_are_stored_and_obeyed(tmp_path):
    # Taxi-v4 reports legal actions in info["action_mask"].
    result = shoal.train(
        "dqn",
        env="Taxi-v4",
        run_dir=str(tmp_path / "taxi"),
        total_steps=3 * ITERATION,
        **small(**{"env.action_mask": "info", "env.num_envs": 2}),
    )
    assert result.env_steps == 3 * ITERATION
    config = DQNConfig(
        env=EnvConfig(id="Taxi-v4", num_envs=2, action_mask="info"),
        model=ModelConfig(hidden=(8,)), rollout_steps=16,
        replay=ReplayConfig(learning_starts=10**6),
    )  # fmt: skip
    algo = DQN(config)
    try:
        algo.train_iteration()
        rollout_mask = algo.sampler.runner.storage.action_mask
        actions = algo.sampler.runner.storage.actions
        valid = algo.sampler.runner.storage.valid
        chosen_legal = rollout_mask.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
        assert chosen_legal[valid].all()
        batch = algo.replay.sample(8)
        assert batch.next_action_mask is not None and batch.next_action_mask.shape == (8, 6)
    finally:
        algo.close()


class MaskedDictEnv(gym.Env):
    """Observation ``{"observation": Box(2), "action_mask": MultiBinary(3)}``: only actions 1
    and 2 are legal and only action 2 pays, so a masked greedy policy must pick 2."""

    observation_space = gym.spaces.Dict(
        {
            "observation": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
            "action_mask": gym.spaces.MultiBinary(3),
        }
    )
    action_space = gym.spaces.Discrete(3)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        assert action in (1, 2), f"illegal action {action} was taken"
        self.t += 1
        return self._obs(), float(action == 2), False, self.t >= 5, {}

    def _obs(self):
        obs = self.np_random.uniform(-1, 1, 2).astype(np.float32)
        return {"observation": obs, "action_mask": np.array([0, 1, 1], np.int8)}


def test_action_masks_from_dict_observations(tmp_path, registered_env):
    env_id = registered_env("shoal-test/MaskedDict-v0", MaskedDictEnv)
    result = shoal.train(
        "dqn",
        env=env_id,
        run_dir=str(tmp_path / "masked"),
        total_steps=6 * ITERATION,
        **small(**{"env.action_mask": "obs", "env.vectorization": "sync"}),
    )
    assert result.env_steps == 6 * ITERATION  # the env asserts that no masked action ran
    with pytest.raises(ConfigError, match="Dict observation space"):
        shoal.train("dqn", env="CartPole-v1", run_dir=str(tmp_path / "bad"),
                    **small(**{"env.action_mask": "obs"}))  # fmt: skip


def test_continuous_actions_are_refused(tmp_path):
    with pytest.raises(UnsupportedSpaceError, match="Discrete actions"):
        shoal.train("dqn", env="Pendulum-v1", run_dir=str(tmp_path / "p"), **small())


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("tau", 0.0, "tau"),
        ("replay.n_step", 0, "n_step"),
        ("replay.prioritized", "weird", "prioritized"),
        ("v_max", -20.0, "v_max"),
        ("epsilon_end", 1.5, "epsilon_end"),
    ],
)
def test_bad_config_values_name_the_field(field, value, match):
    with pytest.raises(ConfigError, match=match):
        shoal.build_config("dqn", **{field: value})


def test_nan_loss_is_reported(tmp_path, monkeypatch):
    def broken(self, batch):
        raise NaNLossError("loss/td became nan; weights left unchanged")

    monkeypatch.setattr(DQNLearner, "update", broken)
    with pytest.raises(NaNLossError, match="loss/td"):
        shoal.train("dqn", run_dir=str(tmp_path / "nan"), total_steps=4 * ITERATION, **small())


def test_nan_in_the_network_raises_naming_the_loss():
    config = DQNConfig(env=EnvConfig(num_envs=2), model=ModelConfig(hidden=(8,)), rollout_steps=8,
                       replay=ReplayConfig(learning_starts=8, batch_size=4))  # fmt: skip
    algo = DQN(config)
    try:
        algo.train_iteration()
        with torch.no_grad():
            next(algo.learner.online.parameters()).fill_(float("nan"))
        before = algo.learner.target.state_dict()
        with pytest.raises(NaNLossError, match="loss/td"):
            algo.train_iteration()
        assert_states_equal(algo.learner.target.state_dict(), before)
    finally:
        algo.close()


@pytest.mark.parametrize("switches", ["double", "rainbow", "rank", "quantile", "rem"])
def test_resume_with_saved_replay_is_exact(switches, tmp_path):
    first, total = 3 * ITERATION, 6 * ITERATION
    # anneal_steps fixed: by default beta anneals over run.total_steps, which the resume changes
    overrides = small(
        **{
            "replay.save": True,
            "run.checkpoint_every_steps": ITERATION,
            "optim.anneal_steps": total,
        },
        **SWITCHES[switches],
    )
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    part = shoal.train("dqn", seed=3, total_steps=first, run_dir=a, **overrides)
    resumed = shoal.train(resume=part.run_dir, total_steps=total)
    straight = shoal.train("dqn", seed=3, total_steps=total, run_dir=b, **overrides)
    got = load_checkpoint(resumed.run_dir).state
    want = load_checkpoint(straight.run_dir).state
    assert_states_equal(got["algorithm"], want["algorithm"])
    assert_states_equal(got["rng"], want["rng"])

    assert metric_rows(resumed.run_dir) == metric_rows(straight.run_dir)


def test_checkpoint_without_replay_resumes_with_an_empty_buffer(tmp_path, capsys):
    part = shoal.train("dqn", total_steps=2 * ITERATION, run_dir=str(tmp_path / "r"), **small())
    assert load_checkpoint(part.run_dir).state["algorithm"]["replay"] is None
    resumed = shoal.train(resume=part.run_dir, total_steps=3 * ITERATION)
    assert resumed.env_steps == 3 * ITERATION
    assert "replay" in capsys.readouterr().out


def test_hard_and_soft_target_updates():
    config = DQNConfig(model=ModelConfig(hidden=(4,)), target_update_every=2, tau=1.0)
    import gymnasium as gym

    learner = DQNLearner(config, gym.spaces.Box(-1, 1, (2,)), gym.spaces.Discrete(2))
    with torch.no_grad():
        for p in learner.online.parameters():
            p.add_(1.0)
    learner._update_target()
    for p, t in zip(learner.online.parameters(), learner.target.parameters(), strict=True):
        assert torch.equal(p, t)
    soft = DQNLearner(
        DQNConfig(model=ModelConfig(hidden=(4,)), tau=0.25),
        gym.spaces.Box(-1, 1, (2,)),
        gym.spaces.Discrete(2),
    )
    before = [t.clone() for t in soft.target.parameters()]
    with torch.no_grad():
        for p in soft.online.parameters():
            p.add_(4.0)
    soft._update_target()
    for b, p, t in zip(before, soft.online.parameters(), soft.target.parameters(), strict=True):
        torch.testing.assert_close(t, b + 0.25 * (p - b))


def test_run_config_defaults_are_used():
    assert isinstance(DQNConfig().run, RunConfig)


def test_noisy_runner_copies_keep_exploring():
    """Runners put only batch norm in eval mode: a noisy network's acting copy stays in
    training mode, so it acts with fresh noise at every step."""
    from shoal.algos.value.dqn import build_model
    from shoal.collect.env_runner import EnvRunner

    config = DQNConfig(noisy=True, env=EnvConfig(num_envs=2))
    runner = EnvRunner(config.env, lambda o, a: build_model(config, o, a), 4, seed=0)
    assert runner.model.training and any(
        m.training for m in runner.model.modules() if hasattr(m, "noise_enabled")
    )
    runner.close()
