"""Scripted players of board games, as fixed opponents (`shoal.envs.opponents`): a yardstick
for trained policies beside the random player.

``TicTacToeHeuristic`` plays PettingZoo's ``tictactoe_v3`` by the textbook rules: complete a
line of its own if it can, else block the opponent's, else take the centre, else a corner,
else any legal square (ties broken by its own seeded generator). Use it as
``--env.opponents GROUP shoal.envs.heuristics:TicTacToeHeuristic`` while training, or
``shoal eval RUN --fixed player_2 shoal.envs.heuristics:TicTacToeHeuristic`` to measure a run.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

LINES = np.array(
    [[0, 1, 2], [3, 4, 5], [6, 7, 8], [0, 3, 6], [1, 4, 7], [2, 5, 8], [0, 4, 8], [2, 4, 6]]
)
"""The 8 winning lines of a 3x3 board, by square index."""
CENTRE, CORNERS = 4, np.array([0, 2, 6, 8])


class TicTacToeHeuristic:
    """Win, block, centre, corner, any legal square. Observations are tic-tac-toe's
    ``[3, 3, 2]`` boards from the mover's side (plane 0 its marks, plane 1 the opponent's);
    the action of the square at row ``r``, column ``c`` is ``3 * r + c``."""

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, seed: int = 0):
        if tuple(observation_space.shape) != (3, 3, 2) or int(action_space.n) != 9:
            raise ValueError(
                f"TicTacToeHeuristic plays tic-tac-toe boards [3, 3, 2] with 9 actions, not "
                f"{observation_space} -> {action_space}"
            )
        self.rng = np.random.default_rng(seed)

    def reset(self, seed: int | None) -> None:
        if seed is not None:
            self.rng = np.random.default_rng(seed)

    def act(self, obs: np.ndarray, action_mask: np.ndarray | None) -> np.ndarray:
        obs = np.asarray(obs)
        lead = obs.shape[:-3]
        boards = obs.reshape(-1, 9, 2)  # squares in action order, 3 * row + column
        if action_mask is None:
            legal = boards.sum(-1) == 0
        else:
            legal = np.asarray(action_mask, bool).reshape(-1, 9)
        choice = [self._choose(b, m) for b, m in zip(boards, legal, strict=True)]
        return np.array(choice, np.int64).reshape(lead)

    def _choose(self, board: np.ndarray, legal: np.ndarray) -> int:
        if not legal.any():
            return 0  # not this player's turn: the move is ignored
        for plane in (0, 1):  # complete a line of mine, else block one of theirs
            marks = board[:, plane][LINES].sum(1)
            free = legal[LINES]
            for line in np.flatnonzero((marks == 2) & free.any(1)):
                return int(LINES[line][free[line]][0])
        if legal[CENTRE]:
            return CENTRE
        corners = CORNERS[legal[CORNERS]]
        options = corners if corners.size else np.flatnonzero(legal)
        return int(self.rng.choice(options))

    def get_state(self) -> dict[str, Any]:
        return {"rng": self.rng.bit_generator.state}

    def set_state(self, state: dict[str, Any]) -> None:
        self.rng.bit_generator.state = state["rng"]


class IntersectionHeuristic:
    """Keep lane, and slow down while another vehicle is in the cone ahead: closer than
    ``gap`` metres ahead and within ``width + spread * ahead`` metres to either side (the
    car in the lane ahead, and vehicles crossing the path in the box). Plays
    ``shoal/intersection-v0``'s discrete actions (0 keep lane, 1 slow down) from its vector
    observations (no ``grid``, one frame), on either backend: the yardstick that validates the
    built-in simulator against SUMO (``benchmarks/intersection.py --validate``) and that
    trained agents must beat."""

    def __init__(
        self,
        observation_space: gym.Space,
        action_space: gym.Space,
        seed: int = 0,
        gap: float = 12.0,
        width: float = 2.0,
        spread: float = 0.5,
    ):
        if tuple(observation_space.shape) != (48,) or int(getattr(action_space, "n", 0)) != 4:
            raise ValueError(
                "IntersectionHeuristic plays shoal/intersection-v0's 48 vector observations "
                f"(no grid, one frame) with 4 discrete actions, not {observation_space} -> "
                f"{action_space}"
            )
        self.gap, self.width, self.spread = gap, width, spread

    def reset(self, seed: int | None) -> None:
        pass

    def act(self, obs: np.ndarray, action_mask: np.ndarray | None = None) -> np.ndarray:
        obs = np.asarray(obs)
        neighbours = obs[..., 8:48].reshape(*obs.shape[:-1], 8, 5)
        ahead, left = neighbours[..., 0] * 50.0, neighbours[..., 1] * 50.0
        seen = neighbours[..., 4] > 0
        blocking = seen & (ahead > 0) & (ahead < self.gap)
        blocking &= np.abs(left) < self.width + self.spread * ahead
        return blocking.any(-1).astype(np.int64)
