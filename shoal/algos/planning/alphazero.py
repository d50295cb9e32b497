"""AlphaZero (Silver et al. 2018, "A general reinforcement learning algorithm that masters
chess, shogi, and Go through self-play"): a policy-value network learns from games it plays
against itself with MCTS on the true rules, and the search plays better than the network
alone because it looks ahead.

One iteration: ``env.num_envs`` self-play games advance ``moves_per_iteration`` moves, all
searched as one batch of trees (`shoal.search.mcts.search`, tree reuse between moves). Each
move's position, legal moves and root visit distribution are kept; when a game ends, its
outcome becomes each position's value target and the positions go to the replay. Then
``updates_per_iteration`` minibatch steps on the loss of `shoal.losses.search.alphazero_loss`
(L2 through the optimizer's weight decay).

With ``arena_games`` > 0 the network that plays self-play is the *best* one, replaced only
when the trained one beats it in an arena by ``arena_threshold`` (AlphaGo Zero's gating,
Silver et al. 2017, "Mastering the game of Go without human knowledge"); 0 plays the latest
network, as AlphaZero does. Every ``eval_every`` iterations the search player meets a random
player and a minimax player (perfect play where ``minimax_depth`` is None):
``eval/vs_random/score``, ``eval/vs_minimax/score`` (wins + draws / 2 over games) and
``eval/vs_minimax/loss_rate``.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from shoal.config import EnvConfig, ModelConfig, OptimConfig, RunConfig, check, check_positive
from shoal.data.positions import PositionReplay, Positions
from shoal.device import resolve_device
from shoal.envs.games import Game, make_game
from shoal.losses.search import alphazero_loss
from shoal.nn.policy_value import PolicyValueNet
from shoal.optim import build_optimizer, minimize
from shoal.policy import ActorPolicy
from shoal.search import MCTSConfig, search, subtree, visit_policy
from shoal.search.arena import SearchPlayer, choose, match
from shoal.search.mcts import gumbel_action, improved_policy
from shoal.search.minimax import MinimaxPlayer, RandomPlayer
from shoal.search.models import GameModel
from shoal.search.tree import clear, restore_tree, tree_arrays
from shoal.seeding import derive_seed

__all__ = ["AlphaZero", "AlphaZeroConfig", "build_model"]


@dataclass(frozen=True)
class AlphaZeroConfig:
    """AlphaZero's settings (the paper's scaled to small boards and a laptop)."""

    run: RunConfig = field(default_factory=lambda: RunConfig(eval_every_steps=0))
    env: EnvConfig = field(default_factory=lambda: EnvConfig(id="openspiel:tic_tac_toe",
                                                             num_envs=32))  # fmt: skip
    """``id``: the game (``openspiel:<game>`` or a PettingZoo turn-based game with action
    masks, see `shoal.envs.games`); ``num_envs``: self-play games played at once."""
    model: ModelConfig = field(default_factory=lambda: ModelConfig(hidden=(128, 128),
                                                                   activation="relu"))  # fmt: skip
    """``hidden``: the MLP trunk (or the value head's hidden layer on boards)."""
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-3, weight_decay=1e-4,
                                                                   max_grad_norm=None))  # fmt: skip
    search: MCTSConfig = field(default_factory=lambda: MCTSConfig(num_simulations=32,
                                                                  dirichlet_alpha=1.0))  # fmt: skip
    """Self-play's search (AlphaZero's alpha scales as about 10 / legal moves)."""
    blocks: int = 0
    """Residual blocks of a board network (``[C, H, W]`` observations); 0: an MLP."""
    channels: int = 64
    """Channels of the board network's convolutions."""
    moves_per_iteration: int = 8
    """Moves each self-play game advances per iteration (one batched search each)."""
    temperature_moves: int = 2
    """The first moves of a self-play game are drawn from the visit counts, later ones are
    the most visited."""
    reuse_tree: bool = True
    """Start each search from the subtree under the move played (its visits kept)."""
    replay_size: int = 20_000
    """Positions kept for training."""
    min_replay: int = 500
    """Positions collected before the first update."""
    batch_size: int = 256
    updates_per_iteration: int = 8
    value_coef: float = 1.0
    """Weight of the value loss beside the policy's cross-entropy."""
    arena_every: int = 0
    """Iterations between arena matches (0: no gating, self-play with the latest network)."""
    arena_games: int = 40
    arena_threshold: float = 0.55
    """The score (wins + draws / 2) the trained network needs to become the best."""
    eval_every: int = 10
    """Iterations between evaluation matches (0: none)."""
    eval_games: int = 20
    """Games of each evaluation match (half of them first)."""
    eval_simulations: int | None = None
    """Simulations of the evaluation matches' searches (None: ``search.num_simulations``)."""
    minimax_depth: int | None = None
    """The minimax opponent's look-ahead in moves (None: to the end, perfect play; small
    games only)."""

    def __post_init__(self) -> None:
        check_positive(self, "channels", "moves_per_iteration", "replay_size", "batch_size",
                       "updates_per_iteration", "arena_games", "eval_games")  # fmt: skip
        for name in ("blocks", "temperature_moves", "min_replay", "arena_every", "eval_every"):
            check(self, name, getattr(self, name) >= 0, "must be >= 0")
        check(self, "arena_threshold", 0.5 <= self.arena_threshold <= 1.0, "must be in [0.5, 1]")
        check(self, "value_coef", self.value_coef >= 0, "must be >= 0")
        for name in ("minimax_depth", "eval_simulations"):
            if getattr(self, name) is not None:
                check_positive(self, name)
        check(self.run, "eval_every_steps", self.run.eval_every_steps == 0,
              "AlphaZero evaluates by playing matches: set eval_every (iterations) and "
              "leave run.eval_every_steps at 0")  # fmt: skip


def build_model(config: AlphaZeroConfig, obs_space: Any, action_space: Any) -> PolicyValueNet:
    """The policy-value network for observations of ``obs_space``'s shape (what `shoal.load`
    rebuilds; it deploys as the network's prior over legal moves, without search)."""
    return PolicyValueNet(tuple(obs_space.shape), int(action_space.n), tuple(config.model.hidden),
                          config.blocks, config.channels, config.model.activation)  # fmt: skip


class AlphaZero:
    """Self-play with batched MCTS, a replay of positions, and policy-value updates."""

    def __init__(self, config: AlphaZeroConfig):
        self.config = cfg = config
        self.game: Game = make_game(config.env.id)
        game = self.game
        self.device = resolve_device(cfg.run.device)
        obs_space = gym.spaces.Box(-np.inf, np.inf, game.observation_shape, np.float32)
        self.deploy_spaces = (obs_space, gym.spaces.Discrete(game.num_actions))
        """The deployed network's observation and action spaces (for `shoal.load`)."""
        self.net = build_model(cfg, *self.deploy_spaces).to(self.device)
        self.best = copy.deepcopy(self.net)
        """The network self-play uses when the arena gates it (else `net`)."""
        opt = cfg.optim
        self.optimizer = build_optimizer(self.net.parameters(), "adam", opt.lr, opt.eps,
                                         opt.weight_decay)  # fmt: skip
        self.replay = PositionReplay(cfg.replay_size, game.observation_shape, game.num_actions,
                                     seed=derive_seed(cfg.run.seed, "replay"))  # fmt: skip
        self.rng = np.random.default_rng(derive_seed(cfg.run.seed, "moves"))
        self.noise = torch.Generator().manual_seed(derive_seed(cfg.run.seed, "root-noise"))
        self.games_started = 0
        self.seeds: list[int] = []
        """The seed of each slot's game (PettingZoo games replay from it on a resume)."""
        self.states = [self._new_game(b) for b in range(cfg.env.num_envs)]
        self.moves = [0] * cfg.env.num_envs
        self.histories: list[list[tuple[np.ndarray, np.ndarray, np.ndarray, int]]] = [
            [] for _ in range(cfg.env.num_envs)
        ]
        self.tree = None
        self.env_steps = self.iteration = self.updates = self.games_finished = 0
        self.promotions = 0

    def _new_game(self, slot: int) -> Any:
        self.games_started += 1
        seed = derive_seed(self.config.run.seed, "game", self.games_started)
        if slot == len(self.seeds):
            self.seeds.append(seed)
        self.seeds[slot] = seed
        return self.game.initial(seed)

    def _evaluator(self, net: PolicyValueNet):
        net.eval()
        return lambda obs: net(obs)

    # --- one iteration --------------------------------------------------------------------

    def train_iteration(self) -> dict[str, float]:
        cfg = self.config
        metrics: dict[str, float] = {}
        outcomes = []
        for _ in range(cfg.moves_per_iteration):
            outcomes += self._self_play_move()
        if len(self.replay) >= cfg.min_replay:
            metrics.update(self._update())
        self.iteration += 1
        if cfg.arena_every and self.iteration % cfg.arena_every == 0 and self.updates:
            metrics.update(self._arena())
        if cfg.eval_every and self.iteration % cfg.eval_every == 0:
            metrics.update(self.evaluate(cfg.eval_games))
        if outcomes:
            first = np.array(outcomes)
            metrics["selfplay/first_player_return"] = float(first.mean())
            metrics["selfplay/draw_rate"] = float((first == 0).mean())
        metrics["selfplay/games"] = float(self.games_finished)
        metrics["arena/promotions"] = float(self.promotions)
        return metrics

    def _self_play_move(self) -> list[float]:
        """One move in every self-play game; the first player's outcome of each game that
        ended (their positions go to the replay, and a new game takes the slot)."""
        cfg, game = self.config, self.game
        player_net = self.best if cfg.arena_every else self.net
        model = GameModel(game, self._evaluator(player_net), self.device)
        tree = search(model, self.states, cfg.search, self.noise, tree=self.tree)
        if cfg.search.gumbel:  # Gumbel MuZero's move and policy target (its own exploration)
            visits = improved_policy(tree, cfg.search)
            actions = gumbel_action(tree, cfg.search).numpy()
        else:
            visits = visit_policy(tree, 1.0)
            sample = torch.tensor([m < cfg.temperature_moves for m in self.moves])
            actions = choose(visits, sample, self.rng)
        finished, outcomes = [], []
        for b, state in enumerate(self.states):
            legal = game.legal(state)
            self.histories[b].append((game.observation(state), legal, visits[b].numpy(),
                                      game.to_move(state)))  # fmt: skip
            self.states[b], _, done = game.play(state, int(actions[b]))
            self.moves[b] += 1
            if done:
                returns = game.returns(self.states[b])
                self._store(self.histories[b], returns)
                outcomes.append(returns[0])
                finished.append(b)
                self.histories[b], self.moves[b] = [], 0
                self.states[b] = self._new_game(b)
        self.env_steps += len(self.states)
        self.games_finished += len(finished)
        if cfg.reuse_tree:
            reused = subtree(tree, torch.as_tensor(actions))
            self.tree = clear(reused, torch.tensor(finished, dtype=torch.long))
        return outcomes

    def _store(self, history: list, returns: tuple[float, float]) -> None:
        obs, legal, policy, players = zip(*history, strict=True)
        outcome = np.array([returns[p] for p in players], np.float32)
        self.replay.add(Positions(np.stack(obs), np.stack(legal), np.stack(policy), outcome))

    def _update(self) -> dict[str, float]:
        cfg = self.config
        self.net.train()
        totals: dict[str, float] = {}
        for _ in range(cfg.updates_per_iteration):
            batch = Positions(*(x.to(self.device) for x in self.replay.sample(cfg.batch_size)))
            logits, value = self.net(batch.obs)
            loss, parts = alphazero_loss(logits, value, batch.policy, batch.outcome, batch.legal,
                                         cfg.value_coef)  # fmt: skip
            minimize({"total": loss, **parts}, self.optimizer, cfg.optim.max_grad_norm)
            for name, value in parts.items():
                totals[name] = totals.get(name, 0.0) + float(value) / cfg.updates_per_iteration
            self.updates += 1
        return totals

    # --- arena and evaluation -------------------------------------------------------------

    def _player(self, net: PolicyValueNet, seed: int, sampled_moves: int,
                simulations: int | None = None) -> SearchPlayer:  # fmt: skip
        search_cfg = self.config.search
        if simulations is not None:
            search_cfg = dataclasses.replace(search_cfg, num_simulations=simulations)
        return SearchPlayer(self.game, self._evaluator(net), search_cfg,
                            sampled_moves=sampled_moves, seed=seed,
                            network_device=self.device)  # fmt: skip

    def _arena(self) -> dict[str, float]:
        """The trained network against the best one; promoted when it scores enough."""
        cfg = self.config
        seed = derive_seed(cfg.run.seed, "arena", self.iteration)
        opening = cfg.temperature_moves  # sampled openings, so that the games differ
        trained, best = self._player(self.net, seed, opening), self._player(self.best, seed + 1,
                                                                            opening)  # fmt: skip
        result = match(self.game, trained, best, cfg.arena_games, seed=seed)
        promoted = result.score >= cfg.arena_threshold
        if promoted:
            self.best.load_state_dict(self.net.state_dict())
            self.promotions += 1
        return {"arena/score": result.score, "arena/promoted": float(promoted)}

    def evaluate(self, games: int) -> dict[str, float]:
        """The search player (the trained network, always its most visited move) against a
        random player and a minimax player (its ties drawn at random), ``games`` games each."""
        cfg = self.config
        seed = derive_seed(cfg.run.seed, "eval", self.iteration)
        player = self._player(self.net, seed, 0, cfg.eval_simulations)
        vs_random = match(self.game, player, RandomPlayer(self.game, seed + 1), games, seed)
        minimax = MinimaxPlayer(self.game, cfg.minimax_depth, seed + 2)
        vs_minimax = match(self.game, player, minimax, games, seed)
        return {
            "eval/vs_random/score": vs_random.score,
            "eval/vs_minimax/score": vs_minimax.score,
            "eval/vs_minimax/loss_rate": vs_minimax.losses / vs_minimax.games,
        }

    # --- deployment and checkpoints -------------------------------------------------------

    def policy(self) -> ActorPolicy:
        """The network alone (its prior over the legal moves), for `shoal.load`."""
        return ActorPolicy(copy.deepcopy(self.net), observation_space=self.deploy_spaces[0],
                           action_space=self.deploy_spaces[1])  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        game = self.game
        return {
            "policy": {"model": self.net.state_dict(), "obs_stats": None},
            "best": self.best.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "replay": self.replay.state_dict(),
            "rng": self.rng.bit_generator.state,
            "noise": self.noise.get_state(),
            "games": [game.history(s) for s in self.states],
            "games_started": self.games_started,
            "seeds": list(self.seeds),
            "moves": list(self.moves),
            "histories": [_pack_history(h) for h in self.histories],
            "tree": None if self.tree is None else tree_arrays(self.tree),
            "counters": [
                self.env_steps,
                self.iteration,
                self.updates,
                self.games_finished,
                self.promotions,
            ],  # fmt: skip
        }

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        self.net.load_state_dict(state["policy"]["model"])
        self.best.load_state_dict(state["best"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.replay.load_state_dict(state["replay"])
        self.rng.bit_generator.state = state["rng"]
        self.noise.set_state(state["noise"])
        self.games_started = int(state["games_started"])
        self.seeds = [int(seed) for seed in state["seeds"]]
        self.states = [self.game.replay(moves, seed) for moves, seed in
                       zip(state["games"], self.seeds, strict=True)]  # fmt: skip
        self.moves = [int(m) for m in state["moves"]]
        self.histories = [_unpack_history(h) for h in state["histories"]]
        tree = state["tree"]
        step = lambda s, a: self.game.play(s, a)[0]  # noqa: E731
        self.tree = None if tree is None else restore_tree(tree, self.states, step)
        counters = [int(c) for c in state["counters"]]
        (self.env_steps, self.iteration, self.updates, self.games_finished,
         self.promotions) = counters  # fmt: skip
        return True

    def close(self) -> None:
        pass


def _pack_history(history: list) -> dict[str, Any]:
    if not history:
        return {"length": 0}
    obs, legal, policy, players = zip(*history, strict=True)
    return {"length": len(history), "obs": np.stack(obs), "legal": np.stack(legal),
            "policy": np.stack(policy), "players": np.array(players)}  # fmt: skip


def _unpack_history(packed: dict[str, Any]) -> list:
    if int(packed["length"]) == 0:
        return []
    columns = [np.asarray(packed[k]) for k in ("obs", "legal", "policy", "players")]
    return [(o, legal, p, int(player)) for o, legal, p, player in zip(*columns, strict=True)]
