"""AlphaZero's self-play by search: a batch of games played against itself with MCTS on the game's
rules, in the learner's process or as a Ray actor (`shoal.algos.planning.alphazero`).

`SearchSelfPlay` holds ``num_games`` games in progress, searched as one batch of trees (the subtree
under each move kept for the next search). `play` advances every game ``moves`` moves with
the weights it was last given and returns the positions of the games that ended: each
position as the player to move saw it, its legal moves, the root's visit distribution (or
the improved policy of a Gumbel search) and that player's final outcome. A finished game's
slot starts a new game at once. Everything it draws comes from its own seeded generators, so
one actor's games are the same whether it runs alone or beside others.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import torch

from shoal.data.positions import Positions
from shoal.envs.games import make_game
from shoal.search import MCTSConfig, search, subtree, visit_policy
from shoal.search.arena import choose
from shoal.search.mcts import gumbel_action, improved_policy
from shoal.search.models import GameModel
from shoal.search.tree import clear, restore_tree, tree_arrays
from shoal.seeding import derive_seed


class SelfPlayResult(NamedTuple):
    positions: Positions | None
    """The finished games' positions (numpy arrays), None when no game ended."""
    first_player_returns: list[float]
    """Each finished game's outcome for its first player."""
    moves: int
    """Moves played (one per game per step)."""


class SearchSelfPlay:
    """``num_games`` self-play games of ``env_id`` with a network from ``model_fn()``."""

    def __init__(self, env_id: str, model_fn: Callable[[], torch.nn.Module],
                 search_config: MCTSConfig, num_games: int, temperature_moves: int,
                 reuse_tree: bool, seed: int, device: str = "cpu"):  # fmt: skip
        self.game = make_game(env_id)
        self.net = model_fn().to(device).eval()
        self.device = device
        self.search_config, self.temperature_moves = search_config, temperature_moves
        self.reuse_tree, self.seed = reuse_tree, seed
        self.rng = np.random.default_rng(derive_seed(seed, "moves"))
        self.noise = torch.Generator().manual_seed(derive_seed(seed, "root-noise"))
        self.games_started = 0
        self.seeds: list[int] = []
        """The seed of each slot's game (PettingZoo games replay from it on a resume)."""
        self.states = [self._new_game(b) for b in range(num_games)]
        self.moves = [0] * num_games
        self.histories: list[list[tuple]] = [[] for _ in range(num_games)]
        self.tree = None

    def _new_game(self, slot: int) -> Any:
        self.games_started += 1
        seed = derive_seed(self.seed, "game", self.games_started)
        if slot == len(self.seeds):
            self.seeds.append(seed)
        self.seeds[slot] = seed
        return self.game.initial(seed)

    def set_weights(self, weights: dict[str, torch.Tensor]) -> None:
        self.net.load_state_dict(weights)

    def play(self, moves: int) -> SelfPlayResult:
        finished: list[tuple[list, tuple[float, float]]] = []
        for _ in range(moves):
            finished += self._move()
        if not finished:
            return SelfPlayResult(None, [], moves * len(self.states))
        rows = [_positions(history, returns) for history, returns in finished]
        positions = Positions(*(np.concatenate(column) for column in zip(*rows, strict=True)))
        return SelfPlayResult(positions, [r[0] for _, r in finished], moves * len(self.states))

    def _move(self) -> list[tuple[list, tuple[float, float]]]:
        """One move in every game; the histories and outcomes of the games that ended."""
        cfg, game = self.search_config, self.game
        net = self.net
        model = GameModel(game, lambda obs: net(obs), self.device)
        tree = search(model, self.states, cfg, self.noise, tree=self.tree)
        if cfg.gumbel:  # Gumbel MuZero's move and policy target (its own exploration)
            targets = improved_policy(tree, cfg)
            actions = gumbel_action(tree, cfg).numpy()
        else:
            targets = visit_policy(tree, 1.0)
            sample = torch.tensor([m < self.temperature_moves for m in self.moves])
            actions = choose(targets, sample, self.rng)
        finished, ended = [], []
        for b, state in enumerate(self.states):
            self.histories[b].append((game.observation(state), game.legal(state),
                                      targets[b].numpy(), game.to_move(state)))  # fmt: skip
            self.states[b], _, done = game.play(state, int(actions[b]))
            self.moves[b] += 1
            if done:
                finished.append((self.histories[b], game.returns(self.states[b])))
                ended.append(b)
                self.histories[b], self.moves[b] = [], 0
                self.states[b] = self._new_game(b)
        if self.reuse_tree:
            reused = subtree(tree, torch.as_tensor(actions))
            self.tree = clear(reused, torch.tensor(ended, dtype=torch.long))
        return finished

    def state_dict(self) -> dict[str, Any]:
        return {
            "rng": self.rng.bit_generator.state,
            "noise": self.noise.get_state(),
            "games": [self.game.history(s) for s in self.states],
            "games_started": self.games_started,
            "seeds": list(self.seeds),
            "moves": list(self.moves),
            "histories": [_pack(h) for h in self.histories],
            "tree": None if self.tree is None else tree_arrays(self.tree),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.bit_generator.state = state["rng"]
        self.noise.set_state(state["noise"])
        self.games_started = int(state["games_started"])
        self.seeds = [int(seed) for seed in state["seeds"]]
        self.states = [self.game.replay(moves, seed) for moves, seed in
                       zip(state["games"], self.seeds, strict=True)]  # fmt: skip
        self.moves = [int(m) for m in state["moves"]]
        self.histories = [_unpack(h) for h in state["histories"]]
        step = lambda s, a: self.game.play(s, a)[0]  # noqa: E731
        tree = state["tree"]
        self.tree = None if tree is None else restore_tree(tree, self.states, step)


def _positions(history: list, returns: tuple[float, float]) -> Positions:
    obs, legal, policy, players = zip(*history, strict=True)
    outcome = np.array([returns[p] for p in players], np.float32)
    return Positions(np.stack(obs), np.stack(legal), np.stack(policy).astype(np.float32), outcome)


def _pack(history: list) -> dict[str, Any]:
    if not history:
        return {"length": 0}
    obs, legal, policy, players = zip(*history, strict=True)
    return {"length": len(history), "obs": np.stack(obs), "legal": np.stack(legal),
            "policy": np.stack(policy), "players": np.array(players)}  # fmt: skip


def _unpack(packed: dict[str, Any]) -> list:
    if int(packed["length"]) == 0:
        return []
    columns = [np.asarray(packed[k]) for k in ("obs", "legal", "policy", "players")]
    return [(o, legal, p, int(player)) for o, legal, p, player in zip(*columns, strict=True)]


class LocalPool:
    """One `SearchSelfPlay` in this process behind the calls of a Ray worker pool
    (`shoal.distributed.ray_workers.WorkerPool`), so the learner drives both alike."""

    def __init__(self, worker: SearchSelfPlay):
        self.workers = [worker]

    def __len__(self) -> int:
        return 1

    def call_all(self, method: str, *args: Any) -> list[Any]:
        return [getattr(self.workers[0], method)(*args)]

    def call_each(self, method: str, args: Callable[[int], tuple]) -> list[Any]:
        return [getattr(self.workers[0], method)(*args(0))]

    def close(self) -> None:
        pass
