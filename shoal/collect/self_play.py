"""Self-play against a pool of past snapshots of the learning policy.

A policy that plays every seat of a game (both players of a board game) learns from one seat
per env while frozen snapshots of its past selves play the others, as fictitious self-play
does (Heinrich, Lanctot and Silver 2015, "Fictitious Self-Play in Extensive-Form Games";
Vinyals et al. 2019, "Grandmaster level in StarCraft II using multi-agent reinforcement
learning", for prioritized fictitious self-play, PFSP). At each episode's start an env draws
the learner's seat uniformly and its opponent from the `SnapshotPool`, uniformly or by PFSP
weights ``(1 - win rate)^p``. Every finished game updates the snapshot's record and the Elo
ratings (Elo 1978, "The Rating of Chessplayers, Past and Present") of the learner and the
snapshot; the opponent's seats never train (their rows are masked in the learner's rollout).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from shoal.config import SelfPlayConfig

ELO_START = 1000.0


class SnapshotPool:
    """Frozen snapshots (weights) with their record against the learner and Elo ratings."""

    def __init__(self, config: SelfPlayConfig, seed: int):
        self.config = config
        self.rng = np.random.default_rng(seed)
        self.weights: dict[int, dict[str, torch.Tensor]] = {}
        """Snapshots by id, oldest first."""
        self.games: dict[int, float] = {}
        self.score: dict[int, float] = {}
        """The learner's points against each snapshot: 1 a win, 0.5 a draw."""
        self.elo: dict[int, float] = {}
        self.learner_elo = ELO_START
        self.next_id = 0

    def __len__(self) -> int:
        return len(self.weights)

    @property
    def ids(self) -> list[int]:
        return list(self.weights)

    def add(self, weights: dict[str, torch.Tensor]) -> list[int]:
        """Add a snapshot (rated as the learner is now); returns the ids dropped to make room."""
        sid = self.next_id
        self.next_id += 1
        self.weights[sid] = {k: v.detach().clone() for k, v in weights.items()}
        self.games[sid], self.score[sid], self.elo[sid] = 0.0, 0.0, self.learner_elo
        dropped = []
        while len(self.weights) > self.config.pool_size:
            old = next(iter(self.weights))
            for table in (self.weights, self.games, self.score, self.elo):
                del table[old]
            dropped.append(old)
        return dropped

    def win_rate(self, sid: int) -> float:
        """The learner's smoothed score against ``sid`` (one win and one loss assumed)."""
        return (self.score[sid] + 1.0) / (self.games[sid] + 2.0)

    def probabilities(self) -> np.ndarray:
        ids = self.ids
        if self.config.sampling == "uniform":
            return np.full(len(ids), 1.0 / len(ids))
        weights = np.array([(1.0 - self.win_rate(s)) ** self.config.pfsp_power for s in ids])
        total = weights.sum()
        return weights / total if total > 0 else np.full(len(ids), 1.0 / len(ids))

    def sample(self, n: int) -> np.ndarray:
        """``n`` opponent ids."""
        return np.array(self.ids)[self.rng.choice(len(self), size=n, p=self.probabilities())]

    def record(self, sid: int, points: float) -> None:
        """A finished game: the learner's ``points`` (1, 0.5 or 0) against snapshot ``sid``."""
        if sid not in self.games:
            return  # the snapshot left the pool during the game
        self.games[sid] += 1.0
        self.score[sid] += points
        expected = 1.0 / (1.0 + 10.0 ** ((self.elo[sid] - self.learner_elo) / 400.0))
        change = self.config.elo_k * (points - expected)
        self.learner_elo += change
        self.elo[sid] -= change

    def state_dict(self) -> dict[str, Any]:
        return {
            "weights": copy.deepcopy(self.weights),
            "games": dict(self.games),
            "score": dict(self.score),
            "elo": dict(self.elo),
            "learner_elo": self.learner_elo,
            "next_id": self.next_id,
            "rng": self.rng.bit_generator.state,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        def keyed(table: dict) -> dict:  # JSON-like round trips may turn int keys to str
            return {int(k): v for k, v in table.items()}

        self.weights = keyed(copy.deepcopy(state["weights"]))
        self.games, self.score = keyed(state["games"]), keyed(state["score"])
        self.elo = keyed(state["elo"])
        self.learner_elo = float(state["learner_elo"])
        self.next_id = int(state["next_id"])
        self.rng.bit_generator.state = state["rng"]


class SelfPlaySeats:
    """Who plays which seat in each of ``num_envs`` envs of a game with ``seats`` seats, and
    the snapshot networks that play the opponents' seats.

    Args:
        pool: the snapshot pool.
        num_envs, seats: ``B`` and the number of seats the policy plays.
        make_model: builds a network of the policy (snapshot weights are loaded into it).
    """

    def __init__(
        self,
        pool: SnapshotPool,
        num_envs: int,
        seats: int,
        make_model: Callable[[], torch.nn.Module],
    ):
        self.pool, self.num_envs, self.seats = pool, num_envs, seats
        self.make_model = make_model
        self.models: dict[int, torch.nn.Module] = {}
        self.learner_seat = np.zeros(num_envs, np.int64)
        self.opponent = np.zeros(num_envs, np.int64)
        self.counted = np.ones(num_envs, bool)
        """Whether the env's running game counts for its opponent's record."""
        self.returns = np.zeros((num_envs, seats))
        self.results: list[float] = []
        """The learner's points in the games finished since the last `drain`."""

    def sync(self) -> None:
        """Networks for the pool's snapshots (new ones built, dropped ones freed); envs whose
        opponent left the pool draw another one and their game stops counting."""
        for sid in [s for s in self.models if s not in self.pool.weights]:
            del self.models[sid]
        for sid, weights in self.pool.weights.items():
            if sid not in self.models:
                model = self.make_model().requires_grad_(False)
                model.load_state_dict(weights)
                self.models[sid] = model
        gone = np.flatnonzero(~np.isin(self.opponent, self.pool.ids))
        if gone.size:
            self.opponent[gone] = self.pool.sample(gone.size)
            self.counted[gone] = False

    def start(self, envs: np.ndarray) -> None:
        """New games in ``envs``: a learner seat and an opponent each."""
        if envs.size:
            self.learner_seat[envs] = self.pool.rng.integers(self.seats, size=envs.size)
            self.opponent[envs] = self.pool.sample(envs.size)
            self.counted[envs] = True
            self.returns[envs] = 0.0

    def opponent_rows(self) -> np.ndarray:
        """``[B, seats]`` bool: the seats a snapshot plays."""
        return np.arange(self.seats)[None, :] != self.learner_seat[:, None]

    def finish(self, rewards: np.ndarray, real: np.ndarray, ended: np.ndarray) -> None:
        """Add a step's rewards ``[B, seats]`` (of the envs where the step was ``real``) and
        score the games that ``ended`` ``[B]``: a win when the learner's return beats every
        opponent seat's, a draw on a tie."""
        self.returns[real] += rewards[real]
        for env in np.flatnonzero(ended):
            mine = self.returns[env, self.learner_seat[env]]
            theirs = np.delete(self.returns[env], self.learner_seat[env]).max()
            points = 1.0 if mine > theirs else 0.5 if mine == theirs else 0.0
            if self.counted[env]:
                self.pool.record(int(self.opponent[env]), points)
                self.results.append(points)
        self.start(np.flatnonzero(ended))

    def drain(self) -> list[float]:
        results, self.results = self.results, []
        return results

    def state_dict(self) -> dict[str, Any]:
        return {
            "pool": self.pool.state_dict(),
            "learner_seat": self.learner_seat.copy(),
            "opponent": self.opponent.copy(),
            "counted": self.counted.copy(),
            "returns": self.returns.copy(),
            "results": list(self.results),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pool.load_state_dict(state["pool"])
        self.learner_seat[:] = state["learner_seat"]
        self.opponent[:] = state["opponent"]
        self.counted[:] = state["counted"]
        self.returns[:] = state["returns"]
        self.results = list(state["results"])
        self.models.clear()
        self.sync()
