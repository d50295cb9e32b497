"""``shoal export``: ONNX and TorchScript files give the actions of ``shoal.load(RUN).act``
for PPO (discrete, continuous with observation normalization), SAC, DQN, ACER (its stochastic
dueling network's policy), a recurrent PPO and R2D2 (their state as explicit inputs and
outputs, over a sequence), MAPPO (the actor's observation only) and MADDPG's groups (one file
each)."""

import importlib.util

import numpy as np
import pytest
import torch

import shoal
from shoal.cli import main
from shoal.errors import ShoalError
from shoal.export import example_observations, export, run_exported

QUIET = {"run.eval_every_steps": 0, "run.console": False, "run.tensorboard": False}
FORMATS = ["torchscript"] + (["onnx"] if importlib.util.find_spec("onnxruntime") else [])
RUNS = {
    "ppo-discrete": ("ppo", {"env": "CartPole-v1", "num_steps": 32}),
    "ppo-continuous-normalized": (
        "ppo", {"env": "Pendulum-v1", "num_steps": 32, "env.normalize_obs": True}),
    "sac": ("sac", {"env": "Pendulum-v1", "replay.learning_starts": 64}),
    "dqn": ("dqn", {"env": "CartPole-v1", "replay.learning_starts": 64}),
    "acer-continuous": ("acer", {"env": "Pendulum-v1", "num_steps": 16}),
}  # fmt: skip


def train(tmp_path, algo, total=256, **overrides):
    overrides = {"model.hidden": (16,), **QUIET, **overrides}
    return shoal.train(algo, run_dir=str(tmp_path / algo), total_steps=total, **overrides).run_dir


@pytest.mark.parametrize("format", FORMATS)
@pytest.mark.parametrize("name", list(RUNS))
def test_exported_policies_act_as_the_run(name, format, tmp_path):
    algo, overrides = RUNS[name]
    run_dir = train(tmp_path, algo, **overrides)
    policy = shoal.load(run_dir)
    [path] = export(policy, tmp_path / "policy", format)
    obs = example_observations(policy.observation_space, 100, seed=11)  # not the check's
    got, want = run_exported(path, obs, format), policy.act(obs)
    if np.issubdtype(want.dtype, np.integer):
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, atol=1e-5)
    if name.endswith("normalized"):  # the statistics are inside the file, not left out
        assert policy.obs_stats is not None and not np.allclose(policy.obs_stats.mean, 0.0)


RECURRENT = {
    "ppo": {"model.lstm_hidden": 8, "minibatch_size": 64},
    "r2d2": {"model.lstm_hidden": 8, "replay.learning_starts": 8, "burn_in": 2, "length": 4,
             "period": 2},
}  # fmt: skip


@pytest.mark.parametrize("format", FORMATS)
@pytest.mark.parametrize("algo", list(RECURRENT))
def test_recurrent_policy_exports_its_state(algo, format, tmp_path):
    run_dir = train(tmp_path, algo, env="CartPole-v1", num_steps=16, **RECURRENT[algo])
    policy = shoal.load(run_dir)
    [path] = export(policy, tmp_path / "lstm", format)
    rng = np.random.default_rng(0)
    steps = [rng.normal(size=(5, 4)).astype(np.float32) for _ in range(6)]
    state = np.zeros((5, 2, 8), np.float32)
    policy.model.reset_state()
    for t, obs in enumerate(steps):  # the file threads the state as act does internally
        want = policy.act(obs, episode_start=np.full(5, t == 0))
        if format == "torchscript":
            module = torch.jit.load(str(path))
            with torch.no_grad():
                out = module(torch.as_tensor(obs), torch.as_tensor(state))
            action, state = out[0].numpy(), out[1].numpy()
        else:
            import onnxruntime

            session = onnxruntime.InferenceSession(str(path))
            action, state = session.run(["action", "next_state"], {"obs": obs, "state": state})
        np.testing.assert_array_equal(action, want)
    assert np.abs(state).sum() > 0


def test_mappo_exports_the_decentralized_policy(tmp_path):
    """MAPPO's rows hold the actor's observation and the centralized critic's input; the
    file reads the actor's part only, and acts as the run does whatever the critic part."""
    run_dir = train(tmp_path, "mappo", env="shoal/spread-v0", num_steps=16, minibatch_size=64)
    policy = shoal.load(run_dir)
    [path] = export(policy, tmp_path / "mappo.pt", "torchscript")
    space = policy.observation_space
    actor = example_observations(space["actor"], 50, seed=3)
    critic = example_observations(space["critic"], 50, seed=4)
    want = policy.act(np.concatenate([actor, critic], 1))
    np.testing.assert_array_equal(run_exported(path, actor, "torchscript"), want)


def test_several_groups_export_one_file_each(tmp_path):
    settings = {"env.num_envs": 4, "rollout_steps": 4, "replay.learning_starts": 32,
                "replay.batch_size": 32}  # fmt: skip
    run_dir = train(tmp_path, "maddpg", 128, env="shoal/tag-v0", **settings)
    policy = shoal.load(run_dir)
    files = export(policy, tmp_path / "tag.pt", "torchscript")
    assert sorted(p.name for p in files) == sorted(f"tag.{g}.pt" for g in policy.groups)
    rng = np.random.default_rng(1)
    obs = {g: rng.normal(size=(3, a.num_agents, a.obs_dim)).astype(np.float32)
           for g, a in policy.model.groups.items()}  # fmt: skip
    want = policy.act(obs)
    for path, group in zip(sorted(files), sorted(policy.groups), strict=True):
        np.testing.assert_array_equal(run_exported(path, obs[group], "torchscript"), want[group])


def test_command_line_and_errors(tmp_path, capsys):
    run_dir = train(tmp_path, "ppo", env="CartPole-v1", num_steps=32)
    assert main(["export", str(run_dir), "--format", "torchscript"]) == 0
    assert (run_dir / "policy.pt").exists()
    assert "its actions equal shoal.load(RUN).act's" in capsys.readouterr().out
    with pytest.raises(ShoalError, match="format must be one of"):
        export(shoal.load(run_dir), tmp_path / "x", "tflite")


@pytest.mark.extra("pettingzoo")
@pytest.mark.parametrize("format", FORMATS)
def test_an_action_masked_policy_exports_with_a_mask_input(format, tmp_path):
    """Tic-tac-toe (PettingZoo masks): the file takes ``action_mask`` and, like
    ``act(obs, action_mask=m)``, never picks an illegal square."""
    from shoal.export import example_masks

    run_dir = train(tmp_path, "ppo", env="pettingzoo:pettingzoo.classic.tictactoe_v3",
                    num_steps=32)  # fmt: skip
    policy = shoal.load(run_dir)
    [path] = export(policy, tmp_path / "policy", format)
    obs = example_observations(policy.observation_space, 100, seed=11)
    mask = example_masks(policy.action_space, 100, seed=12)
    got = run_exported(path, obs, format, action_mask=mask)
    np.testing.assert_array_equal(got, policy.act(obs, action_mask=mask))
    assert mask[np.arange(100), got].all()


def test_a_dict_observation_policy_is_refused_in_user_terms(tmp_path):
    run_dir = train(tmp_path, "ppo", env="shoal/GoalLine-v0", num_steps=32)
    with pytest.raises(ShoalError, match=r"reads Dict\('goal'.*shoal.load\(RUN\).act in Python"):
        export(shoal.load(run_dir), tmp_path / "policy", "torchscript")
