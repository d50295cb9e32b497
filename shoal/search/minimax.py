"""Minimax players for two-player games (`shoal.envs.games.Game`): exact play for small games
(tic-tac-toe, solved by memoized negamax) and depth-limited alpha-beta for larger ones
(connect four), the baselines AlphaZero is measured against.

Values are the mover's: a move's value is its reward plus the next position's value, negated
when the turn passes to the opponent. Positions beyond the depth limit are valued 0."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from shoal.envs.games import Game


def negamax(
    game: Game,
    state: Any,
    depth: int | None = None,
    alpha: float = -math.inf,
    beta: float = math.inf,
    memo: dict | None = None,
) -> float:
    """The value of ``state`` for the player to move, looking ``depth`` moves ahead (None:
    to the end of the game; ``memo`` then caches solved positions by `Game.key`)."""
    legal = np.flatnonzero(game.legal(state))
    if legal.size == 0 or depth == 0:
        return 0.0
    if depth is None and memo is not None:
        key = game.key(state)
        if key in memo:
            return memo[key]
    best = -math.inf
    for action in legal:
        value = _move_value(game, state, int(action), depth, alpha, beta, memo)
        best = max(best, value)
        if depth is not None:  # alpha-beta only where values are not memoized
            alpha = max(alpha, value)
            if alpha >= beta:
                break
    if depth is None and memo is not None:
        memo[game.key(state)] = best
    return best


def _move_value(game: Game, state: Any, action: int, depth: int | None, alpha: float,
                beta: float, memo: dict | None) -> float:  # fmt: skip
    nxt, reward, done = game.play(state, action)
    if done:
        return reward
    rest = None if depth is None else depth - 1
    if game.to_move(nxt) == game.to_move(state):
        return reward + negamax(game, nxt, rest, alpha - reward, beta - reward, memo)
    return reward - negamax(game, nxt, rest, -(beta - reward), -(alpha - reward), memo)


def move_values(game: Game, state: Any, depth: int | None = None,
                memo: dict | None = None) -> np.ndarray:  # fmt: skip
    """``[num_actions]``: each legal move's exact (or depth-limited) value for the mover;
    -inf for illegal moves."""
    values = np.full(game.num_actions, -math.inf)
    for action in np.flatnonzero(game.legal(state)):
        values[action] = _move_value(game, state, int(action), depth, -math.inf, math.inf, memo)
    return values


class MinimaxPlayer:
    """Plays a move of the highest minimax value, drawn uniformly among equal ones.
    ``depth`` None plays perfectly (small games only)."""

    def __init__(self, game: Game, depth: int | None = None, seed: int = 0):
        self.game, self.depth = game, depth
        self.rng = np.random.default_rng(seed)
        self.memo: dict = {}

    def best_moves(self, state: Any) -> np.ndarray:
        values = move_values(self.game, state, self.depth, self.memo)
        return np.flatnonzero(values >= values.max() - 1e-9)

    def act(self, states: list[Any], moves: list[int] | None = None) -> list[int]:
        """A move for each of ``states`` (``moves``, the move numbers, unused)."""
        return [int(self.rng.choice(self.best_moves(state))) for state in states]


class RandomPlayer:
    """Plays a legal move uniformly at random."""

    def __init__(self, game: Game, seed: int = 0):
        self.game = game
        self.rng = np.random.default_rng(seed)

    def act(self, states: list[Any], moves: list[int] | None = None) -> list[int]:
        return [int(self.rng.choice(np.flatnonzero(self.game.legal(s)))) for s in states]
