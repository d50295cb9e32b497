"""Evaluation statistics: one sample per episode on rows of agents, each group and seat
reported apart, a game's win / draw / loss from scripted games with known outcomes, and
`shoal eval` on multi-agent runs with fixed players."""

import csv
import importlib
import json

import numpy as np
import pytest
import torch

import shoal
import shoal.core.errors
from shoal.cli import main
from shoal.collect.evaluate import evaluate_episodes, evaluate_joint_episodes, game_outcomes
from shoal.config import EnvConfig
from shoal.envs import make_env
from shoal.envs.make import make_multi_agent_env

TICTACTOE = "pettingzoo:pettingzoo.classic.tictactoe_v3"
QUIET = {"run.console": False, "run.tensorboard": False, "run.eval_every_steps": 0}


def test_game_outcomes_by_hand():
    a, b = np.array([1.0, 0.0, -1.0, 0.5]), np.array([-1.0, 0.0, 1.0, -0.5])
    outcomes = game_outcomes({"a": a, "b": b}, {"g": a + b}, turn_based=False)
    assert outcomes["a"].tolist() == [1, 0, -1, 1] and outcomes["b"].tolist() == [-1, 0, 1, -1]
    assert "g" not in outcomes  # one group: its seats are the players
    # Two opposing groups: each group's summed return decides its outcome too.
    two = game_outcomes({"a": a, "b": b}, {"x": a, "y": b}, turn_based=False)
    assert two["x"].tolist() == [1, 0, -1, 1]
    # A cooperative team with all-zero returns, and a general-sum env, are no games ...
    assert game_outcomes({"a": 0 * a, "b": 0 * b}, {"g": 0 * a}, turn_based=False) == {}
    assert game_outcomes({"a": a, "b": a}, {"g": 2 * a}, turn_based=False) == {}
    # ... but a turn-based game is one even where a move is not zero-sum (an illegal move
    # costs its mover -1 and the other player nothing: a loss and a draw).
    illegal = game_outcomes({"a": np.array([-1.0]), "b": np.array([0.0])}, {}, turn_based=True)
    assert illegal["a"].tolist() == [-1] and illegal["b"].tolist() == [0]


class LowestLegalSquare:
    """Both players take the lowest legal square: player_1 takes 0, 2, 4, 6 and completes
    the diagonal 2-4-6 on the game's 7th move, every game."""

    groups = ["player"]

    def act(self, obs, deterministic=True, state=None, action_mask=None):
        return {g: np.argmax(m, axis=-1) for g, m in action_mask.items()}


class CoinFlips:
    """CartPole's left or right by torch's coin when sampled, always left when not."""

    def act(self, obs, deterministic=True):
        if deterministic:
            return np.zeros(len(obs), np.int64)
        return torch.randint(0, 2, (len(obs),)).numpy()


def test_a_sampled_evaluation_is_reproducible_and_leaves_the_callers_generator_alone():
    env = make_env(EnvConfig(id="CartPole-v1", num_envs=6))
    torch.manual_seed(0)
    before = torch.get_rng_state()
    first = evaluate_episodes(CoinFlips(), env, seed=3, deterministic=False).returns
    assert torch.equal(torch.get_rng_state(), before)  # training draws on as if none ran
    again = evaluate_episodes(CoinFlips(), env, seed=3, deterministic=False).returns
    other = evaluate_episodes(CoinFlips(), env, seed=4, deterministic=False).returns
    always_left = evaluate_episodes(CoinFlips(), env, seed=3).returns
    env.close()
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)
    # Pushing left every step ends CartPole within about 10 steps; coin flips last longer.
    assert always_left.max() <= 12 < first.mean()


@pytest.mark.extra("pettingzoo")
def test_scripted_tictactoe_games_have_known_outcomes():
    env = make_multi_agent_env(EnvConfig(id=TICTACTOE, num_envs=5))
    counts = []
    episodes = evaluate_joint_episodes(LowestLegalSquare(), env, 0, progress=counts.append)
    env.close()
    assert counts[-1] == 5 and counts == sorted(counts)  # shoal eval's countdown
    assert episodes.outcomes["player_1"].tolist() == [1] * 5
    assert episodes.outcomes["player_2"].tolist() == [-1] * 5
    assert episodes.lengths.tolist() == [7.0] * 5
    metrics = episodes.metrics()
    assert metrics["eval/win/player_1"] == 1.0 and metrics["eval/loss/player_2"] == 1.0
    assert metrics["eval/draw/player_1"] == 0.0


def test_rows_of_agents_give_one_sample_per_episode():
    """5 episodes of a 4-agent env are 5 samples (the mean over the agents), not 20."""
    env = make_env(EnvConfig(id="shoal/intersection-v0", num_envs=5))

    class KeepLane:
        def act(self, obs, deterministic=True):
            return np.zeros(len(obs), np.int64)

    counts = []
    episodes = evaluate_episodes(KeepLane(), env, 1, progress=counts.append)
    env.close()
    assert counts[-1] == 5 and counts == sorted(counts)  # episodes, not rows of agents
    assert episodes.returns.shape == (5,) and episodes.lengths.shape == (5,)
    agents = np.stack(list(episodes.agents.values()), axis=1)
    assert agents.shape == (5, 4)
    np.testing.assert_allclose(episodes.returns, agents.mean(axis=1))


@pytest.mark.extra("pettingzoo")
def test_shoal_eval_reports_seats_and_fixed_players_of_a_rows_run(tmp_path, capsys):
    """PPO trained one policy for both seats (rows of agents): `shoal eval` plays the env's
    own seats, sets a random player in player_2's place, and reports each seat's win, draw
    and loss over the games, never a seats-averaged return."""
    small = {"env.num_envs": 4, "num_steps": 32, "minibatch_size": 64}
    result = shoal.train("ppo", env=TICTACTOE, total_steps=256, run_dir=str(tmp_path / "run"),
                         **small, **QUIET)  # fmt: skip
    args = ["eval", str(result.run_dir), "--episodes", "12", "--fixed", "player_2", "random"]
    assert main([*args, "--json", "-"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert "return" not in report and report["players"] == {"player": "trained",
                                                            "player_2": "random"}  # fmt: skip
    for seat in ("player_1", "player_2"):
        rates = report["outcomes"][seat]
        assert rates["win"]["n"] == 12
        assert sum(r["rate"] for r in rates.values()) == pytest.approx(1.0)
        assert rates["win"]["ci_low"] <= rates["win"]["rate"] <= rates["win"]["ci_high"]
    assert rates["win"]["rate"] == report["outcomes"]["player_1"]["loss"]["rate"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "players: player trained, player_2 random" in out and "12 games" in out
    assert "player_1: win " in out and "return 0.00" not in out


def test_shoal_eval_on_a_team_counts_episodes_and_takes_env_options(tmp_path, capsys):
    """A 4-agent team: the interval is over the 6 episodes; a scripted driver can take every
    agent's place; env options override the run's."""
    result = shoal.train("ppo", env="shoal/intersection-v0", total_steps=256,
                         run_dir=str(tmp_path / "run"), **QUIET,
                         **{"env.num_envs": 4, "num_steps": 16, "minibatch_size": 64})  # fmt: skip
    run = str(result.run_dir)
    assert main(["eval", run, "--episodes", "6", "--json", "-"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["return"]["n"] == 6 and len(report["agents"]) == 4
    assert "completion_rate" in report["env_statistics"]
    driver = "shoal.envs.heuristics:IntersectionHeuristic"
    args = ["eval", run, "--episodes", "6", "--fixed", "agent", driver, "--json", "-"]
    assert main([*args, "--env.kwargs", "traffic", "high"]) == 0
    scripted = json.loads(capsys.readouterr().out)
    assert scripted["players"] == {"agent": driver} and scripted["return"]["n"] == 6
    assert scripted["return"]["mean"] != report["return"]["mean"]
    assert main(["eval", run, "--fixed", "agnt", "random"]) == 2
    assert "no groups or agents ['agnt']" in capsys.readouterr().out
    assert main(["eval", run, "--env.kwargs", "traffic"]) == 2
    assert "NAME VALUE pairs" in capsys.readouterr().out


def test_evaluate_and_a_quiet_run_from_python(tmp_path, capsys):
    result = shoal.train("ppo", env="CartPole-v1", total_steps=256, run_dir=str(tmp_path / "r"),
                         quiet=True, **{"env.num_envs": 4, "num_steps": 32, "minibatch_size": 64,
                                        "run.tensorboard": False})  # fmt: skip
    assert capsys.readouterr().out == ""
    stats = shoal.evaluate(result.run_dir, episodes=6, seed=3)
    assert stats["return"]["n"] == 6 and stats["episodes"] == 6 and stats["players"] == {}
    assert stats["return"]["ci_low"] <= stats["return"]["mean"] <= stats["return"]["ci_high"]
    assert stats == shoal.evaluate(result.run_dir, episodes=6, seed=3)  # reproducible
    sampled = shoal.evaluate(result.run_dir, episodes=6, seed=3, deterministic=False)
    assert sampled == shoal.evaluate(result.run_dir, episodes=6, seed=3, deterministic=False)
    assert sampled["deterministic"] is False
    with pytest.raises(shoal.core.errors.ShoalError, match="multi-agent"):
        shoal.evaluate(result.run_dir, fixed={"agent": "random"})


@pytest.mark.extra("pettingzoo")
def test_a_seat_played_by_another_run_or_checkpoint(tmp_path):
    """``run:PATH`` players: the run set against its own checkpoint plays exactly as the run
    on both seats (deterministic actions); another run can take a seat too."""
    small = {"env.num_envs": 4, "num_steps": 32, "minibatch_size": 64}
    first = shoal.train("ppo", env=TICTACTOE, total_steps=256, run_dir=str(tmp_path / "a"),
                        seed=1, **small, **QUIET)  # fmt: skip
    other = shoal.train("ippo", env=TICTACTOE, total_steps=256, run_dir=str(tmp_path / "b"),
                        seed=2, **small, **QUIET)  # fmt: skip
    alone = shoal.evaluate(first.run_dir, episodes=8)
    [checkpoint] = (tmp_path / "a" / "checkpoints").glob("step_*")
    itself = shoal.evaluate(first.run_dir, episodes=8, fixed={"player_2": f"run:{checkpoint}"})
    assert itself["players"]["player_2"] == f"run:{checkpoint}"
    assert itself["outcomes"] == alone["outcomes"] and itself["agents"] == alone["agents"]
    versus = shoal.evaluate(first.run_dir, episodes=8, fixed={"player_2": f"run:{other.run_dir}"})
    rates = versus["outcomes"]["player_1"]
    assert sum(r["rate"] for r in rates.values()) == pytest.approx(1.0)


@pytest.mark.extra("pettingzoo")
def test_a_seat_played_by_a_snapshot_of_the_self_play_pool(tmp_path, capsys):
    """``pool:ID``: the newest snapshot, taken after the last update, is the policy itself,
    so it plays exactly as the run on both seats; an id the pool lacks is one error naming
    the ids it holds."""
    settings = {"env.num_envs": 4, "num_steps": 8, "minibatch_size": 16, "num_epochs": 1,
                "self_play.snapshot_every": 1, "self_play.pool_size": 2}  # fmt: skip
    result = shoal.train("ippo", env=TICTACTOE, total_steps=96, run_dir=str(tmp_path / "r"),
                         **settings, **QUIET)  # fmt: skip
    alone = shoal.evaluate(result.run_dir, episodes=8)
    newest = shoal.evaluate(result.run_dir, episodes=8, fixed={"player_2": "pool:3"})
    assert newest["outcomes"] == alone["outcomes"] and newest["agents"] == alone["agents"]
    assert main(["eval", str(result.run_dir), "--fixed", "player_2", "pool:0"]) == 2
    assert "the run's self-play pool holds snapshots ['2', '3'], not '0'" in capsys.readouterr().out


def test_sampled_evaluations_during_training_leave_the_training_unchanged(tmp_path):
    """``run.eval_actions=sampled``: the loop's evaluations sample actions (their returns
    differ from the deterministic ones), and training, which draws from the same torch
    generator, goes on exactly as with no evaluation at all."""
    losses, evals = {}, {}
    for name, every, actions in (("none", 0, "deterministic"), ("argmax", 128, "deterministic"),
                                 ("sampled", 128, "sampled")):  # fmt: skip
        run = shoal.train("ppo", env="CartPole-v1", total_steps=512, seed=5, quiet=True,
                          run_dir=str(tmp_path / name),
                          **{"env.num_envs": 4, "num_steps": 32, "minibatch_size": 64,
                             "run.tensorboard": False, "run.eval_every_steps": every,
                             "run.eval_episodes": 8, "run.eval_actions": actions})  # fmt: skip
        with open(run.run_dir / "metrics.csv") as f:
            rows = list(csv.DictReader(f))
        losses[name] = [r["loss/total"] for r in rows if r["loss/total"]]
        evals[name] = [r["eval/return"] for r in rows if r.get("eval/return")]
    assert len(losses["none"]) == 4 and losses["sampled"] == losses["none"] == losses["argmax"]
    assert len(evals["sampled"]) == len(evals["argmax"]) >= 4
    assert evals["sampled"] != evals["argmax"]
    with pytest.raises(shoal.core.errors.ConfigError, match="eval_actions.*must be one of"):
        shoal.train("ppo", env="CartPole-v1", run_dir=str(tmp_path / "bad"),
                    **{"run.eval_actions": "greedy"})  # fmt: skip


def test_shoal_eval_acts_as_the_runs_evaluations_did(tmp_path, capsys):
    """A run trained with ``run.eval_actions=sampled`` is scored with sampled actions by
    ``shoal eval`` and ``shoal.evaluate`` unless told otherwise (``--actions``,
    ``deterministic=``), and the summary says the actions were sampled."""
    run = shoal.train("ppo", env="CartPole-v1", total_steps=256, seed=2, quiet=True,
                      run_dir=str(tmp_path / "r"),
                      **{"env.num_envs": 4, "num_steps": 32, "minibatch_size": 64,
                         "run.tensorboard": False, "run.eval_actions": "sampled"})  # fmt: skip
    default = shoal.evaluate(run.run_dir, episodes=8, seed=4)
    assert default["deterministic"] is False
    assert default == shoal.evaluate(run.run_dir, episodes=8, seed=4, deterministic=False)
    greedy = shoal.evaluate(run.run_dir, episodes=8, seed=4, deterministic=True)
    assert greedy["deterministic"] is True and greedy["return"] != default["return"]
    capsys.readouterr()
    assert main(["eval", str(run.run_dir), "--episodes", "8", "--seed", "4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["return"] == default["return"]
    assert main(["eval", str(run.run_dir), "--episodes", "8", "--seed", "4",
                 "--actions", "deterministic", "--json"]) == 0  # fmt: skip
    assert json.loads(capsys.readouterr().out)["return"] == greedy["return"]
    assert main(["eval", str(run.run_dir), "--episodes", "2"]) == 0
    assert "2 episodes on CartPole-v1 (sampled actions): return" in capsys.readouterr().out


class Recorded:
    """A stand-in for `shoal.train.progress.Countdown` that keeps what it was told."""

    made: list = []

    def __init__(self, total, label):
        self.total, self.label, self.counts = total, label, []
        Recorded.made.append(self)

    def __enter__(self):
        return self.counts.append

    def __exit__(self, *exc):
        pass


def test_shoal_eval_and_its_matches_count_down_their_episodes_and_games(tmp_path, monkeypatch):
    """Long ``shoal eval`` runs show a bar with the time left: each episode (or game of the
    2 x --episodes a game-playing run plays) is counted as it finishes."""
    progress = importlib.import_module("shoal.train.progress")  # shoal.train is the function
    monkeypatch.setattr(progress, "Countdown", Recorded)
    Recorded.made = []
    run = shoal.train("ppo", env="CartPole-v1", total_steps=64, run_dir=str(tmp_path / "ppo"),
                      **{"env.num_envs": 2, "num_steps": 32, "minibatch_size": 64},
                      **QUIET)  # fmt: skip
    assert main(["eval", str(run.run_dir), "--episodes", "3"]) == 0
    (countdown,) = Recorded.made
    assert (countdown.total, countdown.label, countdown.counts[-1]) == (3, "episodes", 3)
    Recorded.made = []
    run = shoal.train("alphazero", env="openspiel:tic_tac_toe", total_steps=8,
                      run_dir=str(tmp_path / "az"), **QUIET,
                      **{"search.num_simulations": 4, "moves_per_iteration": 4,
                         "min_replay": 16, "batch_size": 16, "eval_every": 0,
                         "minimax_depth": 1})  # fmt: skip
    assert main(["eval", str(run.run_dir), "--episodes", "3"]) == 0
    (countdown,) = Recorded.made
    assert (countdown.total, countdown.label) == (6, "games")
    assert countdown.counts[-1] == 6 and countdown.counts == sorted(countdown.counts)
