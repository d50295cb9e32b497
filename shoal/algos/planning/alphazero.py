"""AlphaZero (Silver et al. 2018, "A general reinforcement learning algorithm that masters
chess, shogi, and Go through self-play"): a policy-value network learns from games it plays
against itself with MCTS on the true rules, and the search plays better than the network
alone because it looks ahead.

One iteration: ``env.num_envs`` self-play games advance ``moves_per_iteration`` moves, all
searched as one batch of trees (`shoal.collect.search_play.SearchSelfPlay`, tree reuse
between moves), in this process or, with ``run.runners`` N, in each of N Ray actors with
their own games (weights sent to all, results gathered in worker order, a dead actor
restarted with its seed and new games). Each move's position, legal moves and root visit
distribution are kept; when a game ends, its outcome becomes each position's value target and
the positions go to the replay. Then
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
import functools
from dataclasses import dataclass, field
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
import torch

from shoal.algos.cores.learner_group import ReplayLearnerGroup
from shoal.algos.planning.learners import AlphaZeroLearner, group_learner
from shoal.algos.spec import AlgorithmSpec
from shoal.collect.search_play import SearchSelfPlay, self_play_pool
from shoal.config import (
    EnvConfig,
    ModelConfig,
    OptimConfig,
    RunConfig,
    check,
    check_positive,
    from_dict,
)
from shoal.config.usage import NO_COMPILE, NO_LSTM, Gate
from shoal.core.device import resolve_device
from shoal.core.seeding import derive_seed
from shoal.data.positions import PositionReplay
from shoal.envs.games import Game, make_game
from shoal.nn.policy import ActorPolicy
from shoal.nn.policy_value import PolicyValueNet
from shoal.optim.schedules import scheduled
from shoal.search import MCTSConfig
from shoal.search.arena import (
    MatchResult,
    Progress,
    SearchPlayer,
    baseline_report,
    match,
    versus_baselines,
)

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
    temperature_moves: int = 30
    """The first moves of a self-play game are drawn from the visit counts, later ones are
    the most visited (the paper's 30: every move of a small game). With 2, tic-tac-toe's
    self-play rarely saw the openings its network then misplayed against perfect play."""
    reuse_tree: bool = True
    """Start each search from the subtree under the move played (its visits kept)."""
    replay_size: int = 20_000
    """Positions kept for training."""
    min_replay: int = 500
    """Positions collected before the first update."""
    batch_size: int = 256
    """Positions per gradient step."""
    updates_per_iteration: int = 8
    """Gradient steps after each iteration's self-play moves."""
    value_coef: float = 1.0
    """Weight of the value loss beside the policy's cross-entropy."""
    arena_every: int = 0
    """Iterations between arena matches (0: no gating, self-play with the latest network)."""
    arena_games: int = 40
    """Games of each arena match between the trained and the best network (half first)."""
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

    GATES: ClassVar[dict[str, Gate]] = {
        name: Gate("arena_every", lambda n: n > 0, "with arena gating (arena_every > 0)")
        for name in ("arena_games", "arena_threshold")
    }
    UNUSED: ClassVar[dict[str, str]] = {
        **{f"run.{name}": "it evaluates by matches (eval_every), not by env episodes"
           for name in ("eval_episodes", "eval_actions")},
        **NO_COMPILE,
        **{f"env.{name}": "a game is played by its rules (no wrappers, options or limits)"
           for name in ("normalize_obs", "normalize_reward", "max_episode_steps", "kwargs",
                        "wrappers", "vector_wrappers", "frame_stack")},
        "model.shared_trunk": "its policy and value heads share one trunk",
        **NO_LSTM,
        "model.encoder": "its network is an MLP, or residual blocks for boards (blocks)",
    }  # fmt: skip

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
                          config.blocks, config.channels, config.model.activation,
                          config.model.encoder_activation)  # fmt: skip


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
        self.learner: AlphaZeroLearner | ReplayLearnerGroup
        if cfg.run.learners == 1:
            self.learner = AlphaZeroLearner(cfg, build_model(cfg, *self.deploy_spaces))
        else:  # each batch of positions split among data-parallel copies on Ray actors
            self.learner = group_learner(AlphaZeroLearner, build_model, cfg, *self.deploy_spaces)
        self.best = copy.deepcopy(self.net)
        """The network self-play uses when the arena gates it (else `net`)."""
        self.replay = PositionReplay(cfg.replay_size, game.observation_shape, game.num_actions,
                                     seed=derive_seed(cfg.run.seed, "replay"))  # fmt: skip
        self.players = self._self_play_workers()
        self.env_steps = self.iteration = self.updates = self.games_finished = 0
        self.promotions = 0

    @property
    def net(self) -> PolicyValueNet:
        """The trained network (a learner group's synchronized copy)."""
        return self.learner.model  # type: ignore[return-value]

    def _self_play_workers(self) -> Any:
        """`SearchSelfPlay` workers (`self_play_pool`), each with ``env.num_envs`` games and
        a seed of its own."""
        cfg, run = self.config, self.config.run
        model_fn = functools.partial(build_model, cfg, *self.deploy_spaces)
        args = lambda i: (cfg.env.id, model_fn, cfg.search, cfg.env.num_envs,  # noqa: E731
                          cfg.temperature_moves, cfg.reuse_tree,
                          derive_seed(run.seed, "self-play", i))  # fmt: skip
        return self_play_pool(SearchSelfPlay, args, run, self.device, self._on_restart)

    def _on_restart(self, i: int) -> None:
        """A restarted worker starts new games with its seed; it needs the weights."""
        self.players.call_one(i, "set_weights", self._cpu_weights())

    def _cpu_weights(self) -> dict[str, torch.Tensor]:
        net = self.best if self.config.arena_every else self.net
        return {k: v.detach().cpu() for k, v in net.state_dict().items()}

    def _evaluator(self, net: PolicyValueNet):
        net.eval()
        return lambda obs: net(obs)

    # --- one iteration --------------------------------------------------------------------

    def train_iteration(self) -> dict[str, float]:
        cfg = self.config
        metrics: dict[str, float] = {}
        outcomes = self._self_play()
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

    def _self_play(self) -> list[float]:
        """``moves_per_iteration`` moves of every self-play game with the current weights
        (the best network's when the arena gates); the finished games go to the replay, in
        worker order. Returns their first players' outcomes."""
        self.players.call_all("set_weights", self._cpu_weights())
        results = self.players.call_all("play", self.config.moves_per_iteration)
        outcomes: list[float] = []
        for result in results:
            if result.positions is not None:
                self.replay.add(result.positions)
            outcomes += result.first_player_returns
            self.env_steps += result.moves
        self.games_finished += len(outcomes)
        return outcomes

    def _update(self) -> dict[str, float]:
        cfg = self.config
        totals: dict[str, float] = {}
        horizon = cfg.optim.anneal_steps or cfg.run.total_steps
        self.learner.set_lr(
            scheduled(cfg.optim.lr_schedule, cfg.optim.lr, self.env_steps / horizon)
        )
        for _ in range(cfg.updates_per_iteration):
            parts, _ = self.learner.update(self.replay.sample(cfg.batch_size))
            for name, value in parts.items():
                totals[name] = totals.get(name, 0.0) + float(value) / cfg.updates_per_iteration
            self.updates += 1
        return totals

    # --- arena and evaluation -------------------------------------------------------------

    def _player(self, net: PolicyValueNet, seed: int, sampled_moves: int) -> SearchPlayer:
        return SearchPlayer(self.game, self._evaluator(net), self.config.search,
                            sampled_moves=sampled_moves, seed=seed,
                            network_device=self.device)  # fmt: skip

    def _arena(self) -> dict[str, float]:
        """The trained network against the best one; promoted when it scores enough."""
        cfg = self.config
        seed = derive_seed(cfg.run.seed, "arena", self.iteration)
        opening = cfg.temperature_moves  # sampled openings, so that the games differ
        trained = self._player(self.net, seed, opening)
        best = self._player(self.best, seed + 1, opening)
        result = match(self.game, trained, best, cfg.arena_games, seed=seed)
        promoted = result.score >= cfg.arena_threshold
        if promoted:
            self.best.load_state_dict(self.net.state_dict())
            self.promotions += 1
        return {"arena/score": result.score, "arena/promoted": float(promoted)}

    def evaluate(self, games: int) -> dict[str, float]:
        """The search player (the trained network, always its most visited move) against a
        random player and a minimax player (its ties drawn at random), ``games`` games each."""
        seed = derive_seed(self.config.run.seed, "eval", self.iteration)
        results = play_matches(self.game, self.net, self.config, games, seed, self.device)
        vs_minimax = results["minimax"]
        return {
            "eval/vs_random/score": results["random"].score,
            "eval/vs_minimax/score": vs_minimax.score,
            "eval/vs_minimax/loss_rate": vs_minimax.losses / vs_minimax.games,
        }

    # --- deployment and checkpoints -------------------------------------------------------

    def policy(self) -> ActorPolicy:
        """The network alone (its prior over the legal moves), for `shoal.load`."""
        return ActorPolicy(copy.deepcopy(self.net), observation_space=self.deploy_spaces[0],
                           action_space=self.deploy_spaces[1])  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        players = self.players.call_all("state_dict")
        learner = self.learner.state_dict()
        return {
            "policy": {"model": learner["model"], "obs_stats": None},
            "best": self.best.state_dict(),
            "optimizer": learner["optimizer"],
            **({"group_rng": learner["group_rng"]} if "group_rng" in learner else {}),
            "replay": self.replay.state_dict(),
            "players": players,
            "counters": [
                self.env_steps,
                self.iteration,
                self.updates,
                self.games_finished,
                self.promotions,
            ],  # fmt: skip
        }

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        counters = [int(c) for c in state["counters"]]
        learner = {"model": state["policy"]["model"], "optimizer": state["optimizer"],
                   "grad_steps": counters[2]}  # fmt: skip
        if "group_rng" in state:
            learner["group_rng"] = state["group_rng"]
        self.learner.load_state_dict(learner)
        self.best.load_state_dict(state["best"])
        self.replay.load_state_dict(state["replay"])
        players = state["players"]
        if len(players) != len(self.players):
            raise ValueError(
                f"the checkpoint has {len(players)} self-play workers' games; resume with "
                "the run's own run.runners"
            )
        self.players.call_each("load_state_dict", lambda i: (players[i],))
        (self.env_steps, self.iteration, self.updates, self.games_finished,
         self.promotions) = counters  # fmt: skip
        return True

    def close(self) -> None:
        self.players.close()
        if isinstance(self.learner, ReplayLearnerGroup):  # its Ray actors and placement group
            self.learner.close()


def play_matches(game: Game, net: PolicyValueNet, config: AlphaZeroConfig, games: int,
                 seed: int, device: Any = "cpu",
                 progress: Progress | None = None) -> dict[str, MatchResult]:  # fmt: skip
    """The search with ``net`` (``eval_simulations``, greedy) against a random player and a
    minimax player (``minimax_depth``), ``games`` games each, half of them first."""
    net.eval()
    player = SearchPlayer(game, lambda obs: net(obs), _eval_search(config), seed=seed,
                          network_device=device)  # fmt: skip
    return versus_baselines(game, player, games, seed, config.minimax_depth, progress)


def _eval_search(config: AlphaZeroConfig) -> MCTSConfig:
    if config.eval_simulations is None:
        return config.search
    return dataclasses.replace(config.search, num_simulations=config.eval_simulations)


def evaluate_run(checkpoint: Any, games: int, seed: int,
                 progress: Progress | None = None) -> dict[str, Any]:  # fmt: skip
    """``shoal eval`` of an AlphaZero run: `play_matches` with its trained network."""
    config = from_dict(AlphaZeroConfig, checkpoint.config)
    game = make_game(config.env.id)
    obs_space = gym.spaces.Box(-np.inf, np.inf, game.observation_shape, np.float32)
    net = build_model(config, obs_space, gym.spaces.Discrete(game.num_actions))
    net.load_state_dict(checkpoint.policy_weights)
    results = play_matches(game, net, config, games, seed, progress=progress)
    simulations = _eval_search(config).num_simulations
    return baseline_report(results, config.env.id, games, simulations, config.minimax_depth)


SPECS = (
    AlgorithmSpec(
        "alphazero",
        AlphaZeroConfig,
        AlphaZero,
        build_model,
        "AlphaZero: self-play with batched MCTS on a game's rules, policy-value network, arena",
        "Discrete (two-player turn-based games)",
        runners=True,
        learner_groups=True,
        match_report=evaluate_run,
        own_spaces=True,
    ),
)
"""The names this module registers (`shoal.algos.spec`, `shoal.registry`)."""
