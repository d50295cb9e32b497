"""Players of two-player games and matches between them: a search player (MCTS with a
network, AlphaZero's), and batched matches that play many games at once, each player moving
in all the games where it is to move with one call.

A player has ``act(states, moves) -> actions``: a move for each state, ``moves`` the number
of moves already played in each game (a search player samples its first moves).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np
import torch

from shoal.envs.games import Game
from shoal.search.gumbel import gumbel_action
from shoal.search.mcts import MCTSConfig, search, visit_policy
from shoal.search.minimax import MinimaxPlayer, RandomPlayer
from shoal.search.models import Evaluator, GameModel, LatentModel


class Player(Protocol):
    def act(self, states: list[Any], moves: list[int]) -> list[int]: ...


def choose(visits: torch.Tensor, sample: torch.Tensor, rng: np.random.Generator) -> np.ndarray:
    """Moves from each root's visit distribution ``[B, A]``: drawn from it where ``sample``
    ``[B]`` is set, else the most visited (ties broken at random)."""
    probs = visits.double().numpy()
    out = np.empty(len(probs), np.int64)
    for i, row in enumerate(probs):
        if sample[i]:
            out[i] = rng.choice(len(row), p=row / row.sum())
        else:
            out[i] = rng.choice(np.flatnonzero(row >= row.max() - 1e-12))
    return out


class SearchPlayer:
    """MCTS on the true model with a network's priors and values; no root noise. Samples its
    first ``sampled_moves`` moves of a game from the visit counts (variety between games),
    then plays the most visited move."""

    def __init__(self, game: Game, evaluate: Evaluator, config: MCTSConfig,
                 sampled_moves: int = 0, seed: int = 0, network_device: Any = "cpu"):  # fmt: skip
        self.model = GameModel(game, evaluate, network_device)
        self.config = replace(config, dirichlet_fraction=0.0)
        self.sampled_moves = sampled_moves
        self.rng = np.random.default_rng(seed)

    def act(self, states: list[Any], moves: list[int]) -> list[int]:
        tree = search(self.model, list(states), self.config)
        sample = torch.tensor([m < self.sampled_moves for m in moves])
        return _moves(tree, self.config, sample, self.rng)


class LatentPlayer:
    """MuZero's search in its learned model, from each position's observation with the
    position's legal moves at the root; no root noise, the most visited move."""

    def __init__(self, game: Game, net: Any, config: MCTSConfig, discount: float,
                 seed: int = 0):  # fmt: skip
        self.game, self.net, self.discount = game, net, discount
        self.config = replace(config, dirichlet_fraction=0.0)
        self.rng = np.random.default_rng(seed)

    def act(self, states: list[Any], moves: list[int]) -> list[int]:
        device = next(self.net.parameters()).device
        obs = torch.as_tensor(np.stack([self.game.observation(s) for s in states]), device=device)
        legal = torch.as_tensor(np.stack([self.game.legal(s) for s in states]))
        tree = search(LatentModel(self.net, self.discount, legal), obs, self.config)
        return _moves(tree, self.config, torch.zeros(len(states), dtype=torch.bool), self.rng)


def _moves(tree: Any, config: MCTSConfig, sample: torch.Tensor,
           rng: np.random.Generator) -> list[int]:  # fmt: skip
    """A player's moves after its search: Gumbel's (no generator: the best of the top-m
    moves by the prior), else `choose` over the root's visits."""
    if config.gumbel:
        return gumbel_action(tree, config).tolist()
    return choose(visit_policy(tree, 1.0).cpu(), sample, rng).tolist()


@dataclass
class MatchResult:
    """Outcomes for the first-named player: wins, draws and losses, in each seat."""

    wins: int = 0
    draws: int = 0
    losses: int = 0
    first_losses: int = 0
    second_losses: int = 0

    @property
    def games(self) -> int:
        return self.wins + self.draws + self.losses

    @property
    def score(self) -> float:
        """(wins + draws / 2) / games."""
        return (self.wins + 0.5 * self.draws) / max(self.games, 1)


Progress = Callable[[int], None]
"""Told the count of finished games after each move (`shoal.train.progress.Countdown`)."""


def _after(progress: Progress | None, before: int) -> Progress | None:
    """``progress`` counting on from ``before`` games already finished."""
    return None if progress is None else lambda done: progress(before + done)


def play_games(game: Game, first: Player, second: Player, games: int, seed: int = 0,
               progress: Progress | None = None) -> list[tuple[float, float]]:  # fmt: skip
    """Play ``games`` games at once, ``first`` moving first in all of them; each game's
    returns ``(first's, second's)``."""
    states = [game.initial(seed + i) for i in range(games)]
    moves = [0] * games
    done = [False] * games
    players = (first, second)
    while not all(done):
        for seat, player in enumerate(players):
            turn = [i for i in range(games) if not done[i] and game.to_move(states[i]) == seat]
            if not turn:
                continue
            actions = player.act([states[i] for i in turn], [moves[i] for i in turn])
            for i, action in zip(turn, actions, strict=True):
                states[i], _, done[i] = game.play(states[i], action)
                moves[i] += 1
            if progress is not None:
                progress(sum(done))
    return [game.returns(state) for state in states]


def match(game: Game, player: Player, opponent: Player, games: int, seed: int = 0,
          progress: Progress | None = None) -> MatchResult:  # fmt: skip
    """``player`` against ``opponent``: half of the ``games`` with ``player`` first (the odd
    one too), half second."""
    result = MatchResult()
    first_half = (games + 1) // 2
    for seat, count in ((0, first_half), (1, games - first_half)):
        if count == 0:
            continue
        pair = (player, opponent) if seat == 0 else (opponent, player)
        before = 0 if seat == 0 else first_half
        for returns in play_games(game, *pair, count, seed + 1000 * seat, _after(progress, before)):
            mine, theirs = returns[seat], returns[1 - seat]
            if mine > theirs:
                result.wins += 1
            elif mine < theirs:
                result.losses += 1
                if seat == 0:
                    result.first_losses += 1
                else:
                    result.second_losses += 1
            else:
                result.draws += 1
    return result


def versus_baselines(game: Game, player: Player, games: int, seed: int,
                     minimax_depth: int | None,
                     progress: Progress | None = None) -> dict[str, MatchResult]:  # fmt: skip
    """``player`` against a random player and a minimax player (``minimax_depth`` moves of
    look-ahead; None: perfect play), ``games`` games each, half of them first
    (``progress``: of the ``2 * games``)."""
    minimax = MinimaxPlayer(game, minimax_depth, seed + 2)
    return {
        "random": match(game, player, RandomPlayer(game, seed + 1), games, seed, progress),
        "minimax": match(game, player, minimax, games, seed, _after(progress, games)),
    }


def baseline_report(results: dict[str, MatchResult], env_id: str, games: int,
                    simulations: int, minimax_depth: int | None) -> dict[str, Any]:  # fmt: skip
    """`versus_baselines`'s results as ``shoal eval`` reports them."""
    depth = "perfect play" if minimax_depth is None else f"depth {minimax_depth}"
    names = {"random": "random", "minimax": f"minimax ({depth})"}
    return {
        "env": env_id,
        "games": games,
        "simulations": simulations,
        "opponents": {names[k]: {**vars(r), "score": r.score} for k, r in results.items()},
    }
