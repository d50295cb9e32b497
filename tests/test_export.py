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
from shoal.core.errors import ShoalError
from shoal.studies.export import example_observations, export, run_exported

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
    for batch in (100, 1, 3):  # every batch size, not the one the file was traced with
        got, want = run_exported(path, obs[:batch], format), policy.act(obs[:batch])
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
    from shoal.studies.export import example_masks

    run_dir = train(tmp_path, "ppo", env="pettingzoo:pettingzoo.classic.tictactoe_v3",
                    num_steps=32)  # fmt: skip
    policy = shoal.load(run_dir)
    [path] = export(policy, tmp_path / "policy", format)
    obs = example_observations(policy.observation_space, 100, seed=11)
    mask = example_masks(policy.action_space, 100, seed=12)
    got = run_exported(path, obs, format, action_mask=mask)
    np.testing.assert_array_equal(got, policy.act(obs, action_mask=mask))
    assert mask[np.arange(100), got].all()


GAME = {"env.num_envs": 2, "search.num_simulations": 4, "moves_per_iteration": 4,
        "min_replay": 8, "batch_size": 8, "eval_every": 0, "run.console": False}  # fmt: skip


@pytest.mark.extra("openspiel")
@pytest.mark.parametrize("format", FORMATS)
def test_alphazero_exports_a_network_that_plays_legal_moves(format, tmp_path):
    """AlphaZero deploys its network's prior over legal moves: the file takes the legal-move
    mask (it once had no such input and played occupied squares) and plays by it at every
    batch size, on positions where some squares are taken."""
    from shoal.envs.games import make_game

    run_dir = shoal.train("alphazero", env="openspiel:tic_tac_toe", total_steps=16,
                          run_dir=str(tmp_path / "az"), **GAME).run_dir  # fmt: skip
    policy = shoal.load(run_dir)
    [path] = export(policy, tmp_path / "az", format)
    game = make_game("openspiel:tic_tac_toe")
    states, state = [], game.initial()
    for move in (4, 0, 8):  # three positions, with 1, 2 and 3 squares taken
        state = game.play(state, move)[0]
        states.append(state)
    obs = np.stack([game.observation(s) for s in states])
    mask = np.stack([game.legal(s) for s in states])
    assert not mask.all()
    for batch in (1, 3):
        got = run_exported(path, obs[:batch], format, action_mask=mask[:batch])
        np.testing.assert_array_equal(got, policy.act(obs[:batch], action_mask=mask[:batch]))
        assert mask[np.arange(batch), got].all()
    # Whatever the network prefers, a square that is taken is never played.
    only = np.zeros((1, 9), bool)
    only[0, 2] = True
    assert run_exported(path, obs[:1], format, action_mask=only)[0] == 2


@pytest.mark.parametrize("format", FORMATS)
def test_a_search_policy_is_refused_in_one_line(format, tmp_path, capsys):
    """MuZero deploys a search; a traced search served one batch size (a TorchScript file that
    failed at batch 1, an ONNX export that failed with a 291-line traceback)."""
    run_dir = shoal.train("muzero", env="CartPole-v1", total_steps=32,
                          run_dir=str(tmp_path / "mz"),
                          **{"env.num_envs": 2, "search.num_simulations": 2, "unroll_steps": 2,
                             "steps_per_iteration": 4, "batch_size": 4, "min_replay": 8,
                             "model.hidden": (8,), **QUIET}).run_dir  # fmt: skip
    with pytest.raises(ShoalError, match="a search is not a network"):
        export(shoal.load(run_dir), tmp_path / "mz", format)
    assert main(["export", str(run_dir), "--format", format]) == 2
    said = capsys.readouterr().out.strip()
    assert said.count("\n") == 0 and "muzero deploys a search" in said
    assert not list(tmp_path.glob("mz*.*")) and not list(run_dir.glob("policy.*"))


def test_a_dict_observation_policy_is_refused_in_user_terms(tmp_path):
    run_dir = train(tmp_path, "ppo", env="shoal/GoalLine-v0", num_steps=32)
    with pytest.raises(ShoalError, match=r"reads Dict\('goal'.*shoal.load\(RUN\).act in Python"):
        export(shoal.load(run_dir), tmp_path / "policy", "torchscript")
