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

from shoal.envs.intersection.env import IntersectionEnv
from shoal.envs.intersection.observations import NEIGHBOUR_DIM, OBS_DIM, SCALE, SPEED_SCALE

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
        if observation_space.shape != (3, 3, 2) or int(getattr(action_space, "n", 0)) != 9:
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
        if observation_space.shape != (OBS_DIM,) or int(getattr(action_space, "n", 0)) != 4:
            raise ValueError(
                f"IntersectionHeuristic plays shoal/intersection-v0's {OBS_DIM} vector "
                "observations (no grid, one frame) with 4 discrete actions, not "
                f"{observation_space} -> {action_space}"
            )
        self.gap, self.width, self.spread = gap, width, spread

    def reset(self, seed: int | None) -> None:
        pass

    def act(self, obs: np.ndarray, action_mask: np.ndarray | None = None) -> np.ndarray:
        obs = np.asarray(obs)
        neighbours = obs[..., 8:OBS_DIM].reshape(*obs.shape[:-1], 8, NEIGHBOUR_DIM)
        ahead, left = neighbours[..., 0] * SCALE, neighbours[..., 1] * SCALE
        seen = neighbours[..., 4] > 0
        blocking = seen & (ahead > 0) & (ahead < self.gap)
        blocking &= np.abs(left) < self.width + self.spread * ahead
        return np.asarray(blocking.any(-1), np.int64)


class TimeToConflictDriver:
    """Keep lane unless a conflict is predicted, then slow down: a yield rule by time to
    conflict, from ``shoal/intersection-v0``'s vector observations alone (no grid, one frame).

    Every ``step`` seconds up to ``horizon`` ahead it places itself along its route at
    ``cruise`` m/s (the route's shape read from the observed heading errors 5, 10 and 20 m
    ahead, the heading interpolated linearly in arc length between them) and every observed
    neighbour at its current velocity (the observation's relative velocity plus the agent's
    own). A conflict is a neighbour closer than ``clearance`` metres at the same time, not
    behind the agent, and no farther from the meeting point than the agent is (the nearer one
    goes first; ties yield). Over 100 episodes of random routes at low traffic it completes
    0.98 of them deciding every 0.1 s, 0.94 every 0.5 s (``benchmarks/README.md``): the
    yardstick a trained policy must beat."""

    LOOKAHEAD = IntersectionEnv.lookahead

    def __init__(
        self,
        observation_space: gym.Space,
        action_space: gym.Space,
        seed: int = 0,
        horizon: float = 3.0,
        step: float = 0.25,
        clearance: float = 3.0,
        cruise: float = 10.0,
    ):
        IntersectionHeuristic(observation_space, action_space)  # the same checks
        self.times = np.arange(step, horizon + 1e-9, step)  # [T]
        self.clearance, self.cruise = clearance, cruise

    def reset(self, seed: int | None) -> None:
        pass

    def own_path(self, errors: np.ndarray) -> np.ndarray:
        """``[..., T, 2]`` the agent's positions (own frame, metres) at `times`, cruising
        along the route whose heading relative to its own is ``errors`` ``[..., 3]`` at the
        `LOOKAHEAD` distances (0 at the agent)."""
        arc = np.concatenate([[0.0], self.LOOKAHEAD])  # [4]
        knots = np.concatenate([np.zeros_like(errors[..., :1]), errors], -1)  # [..., 4]
        ds = 0.5
        s = np.arange(0.0, self.cruise * self.times[-1] + ds, ds)  # [S] arc lengths
        upper = np.clip(np.searchsorted(arc, s, side="right"), 1, len(arc) - 1)
        frac = np.clip((s - arc[upper - 1]) / (arc[upper] - arc[upper - 1]), 0.0, 1.0)
        angle = knots[..., upper - 1] + frac * (knots[..., upper] - knots[..., upper - 1])
        steps = ds * np.stack([np.cos(angle), np.sin(angle)], -1)  # [..., S, 2]
        points = np.cumsum(steps, -2) - steps[..., :1, :]  # starts at the agent
        index = np.minimum(np.rint(self.cruise * self.times / ds).astype(np.int64), len(s) - 1)
        return points[..., index, :]

    def act(self, obs: np.ndarray, action_mask: np.ndarray | None = None) -> np.ndarray:
        obs = np.asarray(obs, np.float64)
        speed = obs[..., 3] * SPEED_SCALE
        mine = self.own_path(obs[..., 5:8])[..., None, :, :]  # [..., 1, T, 2]
        near = obs[..., 8:OBS_DIM].reshape(*obs.shape[:-1], 8, NEIGHBOUR_DIM)
        seen = near[..., 4] > 0  # [..., N]
        position = near[..., :2] * SCALE  # [..., N, 2]
        velocity = near[..., 5:7] * SPEED_SCALE
        velocity[..., 0] += speed[..., None]
        t = self.times[:, None]  # [T, 1]
        theirs = position[..., None, :] + t * velocity[..., None, :]  # [..., N, T, 2]
        close = np.linalg.norm(mine - theirs, axis=-1) < self.clearance
        close &= (theirs[..., 0] > -1.0) & seen[..., None]
        first = np.argmax(close, -1)  # [..., N] the first close time
        pick = first[..., None, None]
        mine_to = np.linalg.norm(np.take_along_axis(mine, pick, -2)[..., 0, :], axis=-1)
        meet = np.take_along_axis(theirs, np.broadcast_to(pick, (*pick.shape[:-1], 2)), -2)
        theirs_to = np.linalg.norm(meet[..., 0, :] - position, axis=-1)
        conflict = close.any(-1) & (mine_to >= theirs_to - 0.5)
        return conflict.any(-1).astype(np.int64)
