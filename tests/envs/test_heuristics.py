"""The scripted tic-tac-toe player: its rules on hand-made boards, and its strength."""

import gymnasium as gym
import numpy as np

from shoal.envs.heuristics import TicTacToeHeuristic

SPACE = gym.spaces.Box(0, 1, (3, 3, 2), np.int8)


def board(mine=(), theirs=()):
    b = np.zeros((3, 3, 2), np.int8)
    for square in mine:
        b[square // 3, square % 3, 0] = 1
    for square in theirs:
        b[square // 3, square % 3, 1] = 1
    return b


def test_wins_then_blocks_then_centre_then_corner():
    player = TicTacToeHeuristic(SPACE, gym.spaces.Discrete(9))
    cases = [
        (board(mine=(0, 1), theirs=(3, 4)), 2),  # completes its top row rather than block
        (board(mine=(0,), theirs=(3, 4)), 5),  # blocks the middle row
        (board(mine=(), theirs=(0,)), 4),  # the centre
        (board(mine=(), theirs=(4,)), None),  # a corner
        (board(mine=(0, 8), theirs=(4, 2, 6, 1, 5)), 3),  # blocks 3-4-5 (1-4-7 would do too)
    ]
    obs = np.stack([b for b, _ in cases])[None]  # [1 env, 5 agents, 3, 3, 2]
    chosen = player.act(obs, None)[0]
    for (_, want), got in zip(cases, chosen, strict=True):
        if want is None:
            assert got in (0, 2, 6, 8)
        else:
            assert got == want
    mask = np.zeros((1, 1, 9), bool)  # not its turn: any move (it is ignored)
    assert player.act(board()[None, None], mask).shape == (1, 1)


def test_follows_the_legal_moves_it_is_given():
    player = TicTacToeHeuristic(SPACE, gym.spaces.Discrete(9), seed=3)
    mask = np.zeros((4, 1, 9), bool)
    mask[:, :, 7] = True
    assert (player.act(np.stack([board()[None]] * 4), mask) == 7).all()
