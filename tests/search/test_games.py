"""Games as true models (OpenSpiel and PettingZoo adapters), minimax players, and matches."""

import numpy as np
import pytest
import torch

from shoal.core.errors import ConfigError
from shoal.envs.games import make_game
from shoal.search import MCTSConfig, search, visit_policy
from shoal.search.arena import SearchPlayer, match, play_games
from shoal.search.minimax import MinimaxPlayer, RandomPlayer, move_values, negamax
from shoal.search.models import GameModel, uniform_evaluator

pytestmark = pytest.mark.extra("openspiel", "pettingzoo")

GAMES = ["openspiel:tic_tac_toe", "pettingzoo:pettingzoo.classic.tictactoe_v3"]


@pytest.mark.parametrize("env_id", GAMES)
def test_a_game_plays_without_changing_its_states(env_id):
    game = make_game(env_id)
    assert game.num_actions == 9
    start = game.initial()
    assert game.legal(start).all() and game.to_move(start) == 0
    after, reward, done = game.play(start, 4)
    assert game.legal(start).all()  # the start is unchanged
    assert not game.legal(after)[4] and game.to_move(after) == 1 and reward == 0 and not done
    assert game.observation(after).shape == game.observation_shape
    # X: 0, 1, 2 wins the top row; O plays 3, 4
    state = start
    for move in (0, 3, 1, 4):
        state, _, _ = game.play(state, move)
    final, reward, done = game.play(state, 2)
    assert done and reward == 1.0 and game.returns(final) == (1.0, -1.0)
    assert not game.legal(final).any()
    assert game.history(final) == [0, 3, 1, 4, 2]
    again = game.replay(game.history(state))
    assert game.key(again) == game.key(state)


def test_the_two_adapters_see_one_game():
    """The same moves give the same legal moves and outcomes in both adapters."""
    spiel, zoo = (make_game(g) for g in GAMES)
    rng = np.random.default_rng(0)
    for _ in range(20):
        a, b = spiel.initial(), zoo.initial()
        done = False
        while not done:
            assert np.array_equal(spiel.legal(a), zoo.legal(b))
            move = int(rng.choice(np.flatnonzero(spiel.legal(a))))
            a, reward_a, done = spiel.play(a, move)
            b, reward_b, done_b = zoo.play(b, move)
            assert (reward_a, done) == (reward_b, done_b)
        assert spiel.returns(a) == zoo.returns(b)


def test_games_that_cannot_be_searched_are_refused():
    with pytest.raises(ConfigError, match="not a two-player game"):
        make_game("CartPole-v1")
    with pytest.raises(ConfigError, match="chance nodes"):
        make_game("openspiel:backgammon")
    with pytest.raises(ConfigError, match="no game 'tic_tac_tow'. Did you mean tic_tac_toe") as err:
        make_game("openspiel:tic_tac_tow")
    assert "backgammon" not in str(err.value)  # not OpenSpiel's list of every game
    with pytest.raises(ConfigError, match="no action masks"):
        make_game("pettingzoo:pettingzoo.classic.rps_v2")


def test_minimax_solves_tic_tac_toe():
    """Perfect play draws; after X takes a corner, O's only move that does not lose is the
    centre; a position with a win in one is valued 1."""
    game = make_game("openspiel:tic_tac_toe")
    memo = {}
    assert negamax(game, game.initial(), memo=memo) == 0.0
    corner, _, _ = game.play(game.initial(), 0)
    values = move_values(game, corner, memo=memo)
    assert values[4] == 0.0 and (np.delete(values, [0, 4]) == -1.0).all()
    state = game.initial()
    for move in (0, 3, 1, 4):
        state, _, _ = game.play(state, move)
    assert negamax(game, state, memo=memo) == 1.0
    assert MinimaxPlayer(game).act([state], [4]) == [2]
    # depth-limited: a one-move look-ahead sees the win, depth 0 sees nothing
    assert negamax(game, state, depth=1) == 1.0 and negamax(game, state, depth=0) == 0.0


def test_perfect_players_always_draw_and_random_loses():
    game = make_game("openspiel:tic_tac_toe")
    perfect = match(game, MinimaxPlayer(game, seed=0), MinimaxPlayer(game, seed=1), 10)
    assert perfect.draws == 10
    random = match(game, RandomPlayer(game, 0), MinimaxPlayer(game, seed=1), 20)
    assert random.wins == 0 and random.losses >= 10
    assert random.first_losses + random.second_losses == random.losses


def test_play_games_batches_moves_and_reports_returns():
    game = make_game("openspiel:tic_tac_toe")
    returns = play_games(game, RandomPlayer(game, 0), RandomPlayer(game, 1), 30)
    assert len(returns) == 30 and all(a == -b for a, b in returns)


def test_search_with_the_true_game_finds_the_win_through_an_adapter():
    """X X _ / O O _ / _ _ _ with X to move: the search (uniform prior, no network) plays 2,
    in OpenSpiel's and PettingZoo's tic-tac-toe alike."""
    for env_id in GAMES:
        game = make_game(env_id)
        state = game.replay([0, 3, 1, 4])
        tree = search(GameModel(game, uniform_evaluator(9)), [state],
                      MCTSConfig(num_simulations=200, dirichlet_fraction=0.0))  # fmt: skip
        assert int(visit_policy(tree, 0.0).argmax()) == 2
        player = SearchPlayer(game, uniform_evaluator(9), MCTSConfig(num_simulations=200))
        assert player.act([state], [4]) == [2]


def test_connect_four_depth_limited_minimax_blocks():
    """Depth 2 sees the opponent's threat: X has three in column 0, O to move must block."""
    game = make_game("openspiel:connect_four")
    state = game.replay([0, 1, 0, 1, 0])  # X: 0, 0, 0; O: 1, 1
    assert MinimaxPlayer(game, depth=2).act([state], [5]) == [0]
    assert game.observation(state).shape == game.observation_shape == (4, 6, 7)
    assert torch.as_tensor(game.observation(state)).dtype == torch.float32


def test_a_game_as_a_self_play_vector_env():
    """Each step is the mover's move: the mover's reward, the next mover's observation and
    legal moves, next-step autoreset, the first player's outcome as the episode's return,
    and a state that restores the games in progress."""
    from shoal.envs.games import GameVectorEnv

    env = GameVectorEnv(make_game("openspiel:tic_tac_toe"), 2)
    obs = env.reset(seed=0)
    assert obs.shape == (2, 4, 3, 3) and env.action_mask.all()
    for move in (0, 3, 1, 4):
        result = env.step(np.array([move, 8 - move]))
        assert not result.terminated.any()
    saved = env.get_state()
    result = env.step(np.array([2, 0]))  # game 0: X completes the top row; game 1 goes on
    assert result.terminated.tolist() == [True, False] and result.reward.tolist() == [1.0, 0.0]
    assert result.episode_returns.tolist() == [1.0] and result.episode_lengths.tolist() == [5]
    assert not result.action_mask[0].any() and result.action_mask[1].sum() == 4  # 5 played
    result = env.step(np.array([0, 1]))  # game 0 restarts (its action is ignored)
    assert result.autoreset.tolist() == [True, False] and result.action_mask[0].all()
    other = GameVectorEnv(make_game("openspiel:tic_tac_toe"), 2)
    other.reset(seed=5)
    other.set_state(saved)
    np.testing.assert_array_equal(other.step(np.array([2, 0])).reward, [1.0, 0.0])
    with pytest.raises(ValueError, match="illegal move"):
        env.step(np.array([4, 4]))
