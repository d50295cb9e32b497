"""AlphaZero: a smoke run through `shoal.train`, exact resume, loading the trained network,
refused settings, and learning tic-tac-toe against perfect play."""

import json

import numpy as np
import pytest
import torch
from board_games import shallow_minimax
from state_helpers import assert_states_equal, metric_rows

import shoal
from shoal.algos.planning.alphazero import AlphaZero, AlphaZeroConfig
from shoal.cli import main
from shoal.config import replace
from shoal.core.errors import ConfigError
from shoal.search.arena import SearchPlayer, match
from shoal.search.minimax import MinimaxPlayer
from shoal.train.checkpoint import load_checkpoint

pytestmark = pytest.mark.extra("openspiel", "pettingzoo")

SMALL = {
    "env.num_envs": 4,
    "search.num_simulations": 8,
    "moves_per_iteration": 4,
    "min_replay": 16,
    "batch_size": 16,
    "updates_per_iteration": 2,
    "eval_every": 2,
    "eval_games": 2,
    "run.console": False,
}


@pytest.mark.parametrize("env_id", ["openspiel:tic_tac_toe",
                                    "pettingzoo:pettingzoo.classic.tictactoe_v3"])  # fmt: skip
def test_smoke_trains_and_deploys_the_network(env_id, tmp_path):
    result = shoal.train("alphazero", env=env_id, total_steps=64, run_dir=str(tmp_path / "r"),
                         **{**SMALL, "arena_every": 2, "arena_games": 2,
                            **shallow_minimax(env_id)})  # fmt: skip
    assert result.env_steps == 64 and result.iterations == 4
    rows = metric_rows(tmp_path / "r")
    assert any("loss/policy" in row for row in rows)
    assert any("eval/vs_minimax/score" in row for row in rows)
    assert any("arena/score" in row for row in rows)
    policy = shoal.load(result.run_dir)
    obs = np.zeros((2, *policy.observation_space.shape), np.float32)
    mask = np.zeros((2, 9), bool)
    mask[0, 3], mask[1, [5, 7]] = True, True
    actions = policy.act(obs, action_mask=mask)
    assert actions[0] == 3 and actions[1] in (5, 7)
    report = shoal.evaluate(result.run_dir, episodes=2)  # matches, not env episodes
    assert report["env"] == env_id and report["games"] == 2
    for outcome in report["opponents"].values():
        assert outcome["wins"] + outcome["draws"] + outcome["losses"] == 2
    out = tmp_path / "report.json"
    assert main(["eval", str(result.run_dir), "--episodes", "2", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["opponents"].keys() == report["opponents"].keys()
    assert main(["eval", str(result.run_dir), "--video", str(tmp_path / "v.gif")]) == 2


@pytest.mark.parametrize("env_id", ["openspiel:connect_four",
                                    "pettingzoo:pettingzoo.classic.connect_four_v3"])  # fmt: skip
def test_board_games_train_with_a_residual_network(env_id, tmp_path):
    """Connect four through both adapters, with the convolutional network."""
    result = shoal.train("alphazero", env=env_id, total_steps=32, run_dir=str(tmp_path / "r"),
                         **{**SMALL, "blocks": 1, "channels": 8, "eval_every": 0})  # fmt: skip
    assert result.env_steps == 32
    policy = shoal.load(result.run_dir)
    assert policy.observation_space.shape[1:] == (6, 7)
    assert policy.act(np.zeros((1, *policy.observation_space.shape), np.float32)).shape == (1,)


def test_resume_is_exact(tmp_path):
    """Stopped mid-game (the games in progress, their trees and histories in the checkpoint)
    and resumed, a run ends where an unbroken one does."""
    settings = {**SMALL, "run.checkpoint_every_steps": 32, "eval_every": 3}
    part = shoal.train("alphazero", seed=3, total_steps=48, run_dir=str(tmp_path / "a"),
                       **settings)  # fmt: skip
    resumed = shoal.train(resume=part.run_dir, total_steps=112)
    straight = shoal.train("alphazero", seed=3, total_steps=112, run_dir=str(tmp_path / "b"),
                           **settings)  # fmt: skip
    assert resumed.env_steps == straight.env_steps == 112
    got, want = load_checkpoint(resumed.run_dir).state, load_checkpoint(straight.run_dir).state
    assert_states_equal(got["algorithm"], want["algorithm"])
    assert metric_rows(tmp_path / "a") == metric_rows(tmp_path / "b")


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"env.id": "CartPole-v1"}, "not a two-player game"),
        ({"env.id": "openspiel:backgammon"}, "chance nodes"),
        ({"env.id": "pettingzoo:pettingzoo.classic.rps_v2"}, "no action masks"),
        ({"search.num_simulations": 0}, "num_simulations"),
        ({"run.eval_every_steps": 1000}, "evaluates by playing matches"),
        ({"arena_threshold": 0.3}, "arena_threshold"),
    ],
)
def test_bad_settings_are_refused_before_anything_runs(overrides, match, tmp_path):
    with pytest.raises(ConfigError, match=match):
        shoal.train("alphazero", run_dir=str(tmp_path / "r"), **{"run.console": False,
                                                                 **overrides})  # fmt: skip


@pytest.mark.learning
def test_learns_to_draw_against_perfect_play():
    """After 40 iterations (10,240 self-play moves, about 30 s on one core) the search with
    the trained network (128 simulations) never loses to a perfect minimax player in 40
    games (half first), while the same search with the untrained network loses a quarter
    or more."""
    torch.manual_seed(0)
    config = replace(AlphaZeroConfig(), **{"eval_every": 0, "run.seed": 0})
    algo = AlphaZero(config)
    game = algo.game

    def losses() -> int:
        player = SearchPlayer(game, algo._evaluator(algo.net),
                              replace(config.search, num_simulations=128), seed=1)  # fmt: skip
        return match(game, player, MinimaxPlayer(game, seed=2), 40, seed=3).losses

    untrained = losses()
    for _ in range(40):
        algo.train_iteration()
    assert untrained >= 10
    assert losses() == 0


def test_gumbel_self_play_trains(tmp_path):
    """``search.gumbel``: moves by sequential halving, targets from the improved policy."""
    settings = {**SMALL, "search.gumbel": True, "search.max_considered": 4}
    result = shoal.train("alphazero", total_steps=32, run_dir=str(tmp_path / "r"), **settings)
    assert result.env_steps == 32
    assert any("loss/policy" in row for row in metric_rows(tmp_path / "r"))


def test_the_learning_rate_follows_its_schedule():
    """``optim.lr_schedule linear`` decays the learning rate over ``run.total_steps``."""
    config = shoal.api.build_config("alphazero", **{**SMALL, "eval_every": 0,
                                                    "optim.lr_schedule": "linear",
                                                    "run.total_steps": 64})  # fmt: skip
    algo = AlphaZero(config)
    for _ in range(3):
        algo.train_iteration()
    lr = algo.learner.optimizer.param_groups[0]["lr"]
    want = config.optim.lr * (1 - 48 / 64)  # set before the updates, after the moves
    assert algo.env_steps == 48 and abs(lr - want) < 1e-12
