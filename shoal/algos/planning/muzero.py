"""MuZero (Schrittwieser et al. 2020, "Mastering Atari, Go, Chess and Shogi by Planning with a
Learned Model") on single-agent Gymnasium envs with discrete actions.

One iteration: ``steps_per_iteration`` steps of ``env.num_envs`` envs, each step one batched
search in the network's hidden states (`shoal.collect.search_play.LatentSelfPlay`; with
``run.runners`` N, in each of N Ray workers with envs of their own), the move drawn from
the root's visits at a temperature that falls as training goes on (``temperatures``, each
from its step in ``temperature_steps``: 1, 0.5 and 0.25 as in muzero-general). Finished episodes
go to a prioritized replay with their n-step value targets (`episode_value_targets`:
terminal and truncated endings apart). Then ``updates_per_iteration`` steps on unrolls of
``unroll_steps``: the representation, ``K`` dynamics steps with the replay's actions (each
hidden state's gradient halved), and the loss of `shoal.losses.search.muzero_loss` on
two-hot targets of the transformed values and rewards.

The deployed policy is the search itself (`SearchPolicy`): ``act(obs)`` plans from the
observation with the learned model and plays the most visited action.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from shoal.algos.cores.learner_group import ReplayLearnerGroup
from shoal.algos.planning.learners import MuZeroLearner, group_learner
from shoal.algos.spec import AlgorithmSpec
from shoal.collect.search_play import FinishedEpisode, LatentSelfPlay, self_play_pool
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
from shoal.core.errors import ConfigError
from shoal.core.seeding import derive_seed
from shoal.data.trajectories import Episode, TrajectoryReplay
from shoal.envs.games import is_game_id, make_game
from shoal.losses.search import (
    episode_value_targets,
)
from shoal.losses.value import value_transform
from shoal.nn.distributions import Categorical
from shoal.nn.muzero import MuZeroNet
from shoal.nn.policy import ActorPolicy
from shoal.optim.schedules import scheduled
from shoal.search import MCTSConfig, search, visit_policy
from shoal.search.arena import (
    LatentPlayer,
    MatchResult,
    Progress,
    baseline_report,
    versus_baselines,
)
from shoal.search.models import LatentModel

__all__ = ["MuZero", "MuZeroConfig", "SearchPolicy", "build_model"]


@dataclass(frozen=True)
class MuZeroConfig:
    """MuZero's settings (muzero-general's CartPole scale)."""

    run: RunConfig = field(default_factory=lambda: RunConfig(total_steps=50_000,
                                                             eval_every_steps=5_000))  # fmt: skip
    env: EnvConfig = field(default_factory=lambda: EnvConfig(num_envs=16))
    model: ModelConfig = field(default_factory=lambda: ModelConfig(hidden=(64,),
                                                                   activation="relu"))  # fmt: skip
    """``hidden``: the layers of each of the three MLPs."""
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-3, weight_decay=1e-4,
                                                                   max_grad_norm=5.0))  # fmt: skip
    search: MCTSConfig = field(
        default_factory=lambda: MCTSConfig(num_simulations=25, dirichlet_alpha=0.25)
    )
    """The search in the learned model, at every step of self-play and of the deployed policy."""
    latent: int = 32
    """Size of the hidden state."""
    support_size: int = 25
    """``S``: values and rewards are predicted over the integers ``-S..S`` of
    ``h(x) = sign(x)(sqrt(|x| + 1) - 1) + 0.001 x``; ``S = 25`` covers returns up to about
    640 (a run stops with an error naming the size it needs if a target falls outside)."""
    discount: float = 0.997
    """Per step; -1 for a two-player game taking turns (``openspiel:<game>`` or a PettingZoo
    turn-based game, played as self-play: every move hands the value to the opponent)."""
    unroll_steps: int = 5
    """``K``: dynamics steps unrolled per sample."""
    n_step: int = 50
    """Steps of rewards in the value targets before bootstrapping."""
    steps_per_iteration: int = 8
    """Vector env steps (searches) per iteration."""
    replay_size: int = 50_000
    """Positions kept."""
    min_replay: int = 1_000
    """Positions collected before the first update."""
    batch_size: int = 128
    """Unrolls per gradient step."""
    updates_per_iteration: int = 8
    """Gradient steps after each iteration's env steps."""
    value_coef: float = 0.25
    """Weight of the value loss beside the policy's and the reward's (the paper's 0.25 for
    reanalysed data, which keeps the value from overfitting)."""
    temperatures: tuple[float, ...] = (1.0, 0.5, 0.25)
    """Self-play's visit-count temperatures, the first from the start."""
    temperature_steps: tuple[int, ...] = (25_000, 37_500)
    """The env steps from which the second, third, ... temperatures apply (counted in env
    steps, not as a fraction of ``run.total_steps``, so that a resumed run that trains for
    longer keeps the schedule)."""
    priority_alpha: float = 0.5
    """Prioritized replay's exponent (0: uniform)."""
    priority_beta: float = 1.0
    """Importance-sampling exponent of the prioritized replay."""
    eval_every: int = 0
    """Two-player games: iterations between evaluation matches against a random and a
    minimax player (other envs are evaluated on ``run.eval_every_steps``)."""
    eval_games: int = 20
    """Two-player games: games of each evaluation match (half of them first)."""
    minimax_depth: int | None = None
    """Two-player games: the minimax opponent's look-ahead (None: perfect play)."""

    GATES: ClassVar[dict[str, Gate]] = {
        name: Gate("env.id", is_game_id, "on two-player games (matches against fixed players)")
        for name in ("eval_games", "minimax_depth")
    }
    UNUSED: ClassVar[dict[str, str]] = {
        **NO_COMPILE,
        "model.shared_trunk": "its three functions are networks of their own",
        **NO_LSTM,
        "model.encoder": "its representation network is an MLP",
    }

    def __post_init__(self) -> None:
        check_positive(self, "latent", "support_size", "unroll_steps", "n_step",
                       "steps_per_iteration", "replay_size", "batch_size",
                       "updates_per_iteration")  # fmt: skip
        if is_game_id(self.env.id):
            check(self, "discount", self.discount == -1.0,
                  f"must be -1 for the two-player game {self.env.id}: each move hands the "
                  "value to the other player")  # fmt: skip
            check(self.run, "eval_every_steps", self.run.eval_every_steps == 0,
                  "MuZero evaluates a two-player game by playing matches: set eval_every "
                  "(iterations) and leave run.eval_every_steps at 0")  # fmt: skip
        else:
            check(self, "discount", 0.0 < self.discount <= 1.0, "must be in (0, 1]")
        check(self, "eval_every", self.eval_every >= 0, "must be >= 0")
        check_positive(self, "eval_games")
        if self.minimax_depth is not None:
            check_positive(self, "minimax_depth")
        check(self, "min_replay", self.min_replay >= 0, "must be >= 0")
        check(self, "value_coef", self.value_coef >= 0, "must be >= 0")
        check(self, "priority_alpha", self.priority_alpha >= 0, "must be >= 0")
        check(self, "priority_beta", 0 <= self.priority_beta <= 1, "must be in [0, 1]")
        check(self, "temperatures", len(self.temperatures) == len(self.temperature_steps) + 1
              and all(t > 0 for t in self.temperatures),
              "must be positive, one more than temperature_steps")  # fmt: skip


class SearchPolicy(nn.Module):
    """The deployable MuZero policy: ``distribution(obs)`` searches from each observation with
    the learned model and returns a categorical over the root's visit counts (its mode is the
    most visited action), so `shoal.nn.policy.ActorPolicy` acts with search."""

    def __init__(self, net: MuZeroNet, search_config: MCTSConfig, discount: float):
        super().__init__()
        self.net, self.discount = net, discount
        self.search_config = search_config

    @torch.inference_mode()
    def distribution(self, obs: torch.Tensor, action_mask: torch.Tensor | None = None):
        model = LatentModel(self.net, self.discount, action_mask)
        tree = search(model, obs.float(), self.search_config)
        return Categorical(torch.log(visit_policy(tree, 1.0).clamp(min=1e-12)))


def build_model(
    config: MuZeroConfig, obs_space: gym.Space, action_space: gym.Space
) -> SearchPolicy:
    """The search policy around a fresh network (what `shoal.load` rebuilds)."""
    if not isinstance(action_space, gym.spaces.Discrete):
        raise ConfigError(
            f"muzero searches over discrete actions; {config.env.id} has {action_space}"
        )
    if not isinstance(obs_space, gym.spaces.Box):
        raise ConfigError(f"muzero reads Box observations; {config.env.id} has {obs_space}")
    net = MuZeroNet(obs_space.shape, int(action_space.n), config.latent, tuple(config.model.hidden),
                    config.support_size, config.model.activation)  # fmt: skip
    evaluation = dataclasses.replace(config.search, dirichlet_fraction=0.0)
    return SearchPolicy(net, evaluation, config.discount)


class MuZero:
    """Self-play with search in the learned model, a prioritized replay of episodes, and
    unrolled updates of the three functions."""

    def __init__(self, config: MuZeroConfig):
        self.config = cfg = config
        self.device = resolve_device(cfg.run.device)
        self.players = self._self_play_workers()
        spaces = self.players.call_all("describe")[0]
        if spaces["agents_per_env"] != 1:
            raise ConfigError(f"muzero plays single-agent envs; {cfg.env.id} has several agents")
        self.deploy_spaces = (spaces["observation_space"], spaces["action_space"])
        self.policy_module = build_model(cfg, *self.deploy_spaces)
        self.learner: MuZeroLearner | ReplayLearnerGroup
        if cfg.run.learners == 1:
            self.learner = MuZeroLearner(cfg, self.policy_module.net)
        else:  # each batch of unrolls split among data-parallel copies on Ray actors
            self.learner = group_learner(MuZeroLearner, _network, cfg, *self.deploy_spaces)
        self.replay = TrajectoryReplay(cfg.replay_size, self.deploy_spaces[0].shape,
                                       self.net.num_actions, cfg.priority_alpha,
                                       seed=derive_seed(cfg.run.seed, "replay"))  # fmt: skip
        self.env_steps = self.iteration = self.updates = 0

    def _self_play_workers(self) -> Any:
        """`LatentSelfPlay` workers (`self_play_pool`), each with ``env.num_envs`` envs and a
        seed of its own (the in-process one seeded by ``run.seed`` itself). The network is
        built from the env's spaces, which the workers report."""
        cfg, run = self.config, self.config.run
        model_fn = functools.partial(_network, cfg)
        args = lambda i: (cfg.env, model_fn, cfg.search, cfg.discount,  # noqa: E731
                          derive_seed(run.seed, "self-play", i))  # fmt: skip
        local = (cfg.env, model_fn, cfg.search, cfg.discount, run.seed)
        return self_play_pool(LatentSelfPlay, args, run, self.device, self._on_restart, local)

    def _on_restart(self, i: int) -> None:
        """A restarted worker starts new episodes with its seed; it needs the weights."""
        self.players.call_one(i, "set_weights", self._cpu_weights())

    def _cpu_weights(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu() for k, v in self.net.state_dict().items()}

    def temperature(self, env_steps: int | None = None) -> float:
        """Self-play's visit temperature at ``env_steps`` (default: now)."""
        cfg = self.config
        steps = self.env_steps if env_steps is None else env_steps
        return cfg.temperatures[sum(steps >= edge for edge in cfg.temperature_steps)]

    # --- one iteration --------------------------------------------------------------------

    def train_iteration(self) -> dict[str, float]:
        cfg = self.config
        returns = self._self_play()
        metrics: dict[str, float] = {"search/temperature": self.temperature()}
        if len(self.replay) >= max(cfg.min_replay, 1):
            metrics.update(self._update())
        if returns:
            metrics["episode/return"] = float(np.mean(returns))
        self.iteration += 1
        if cfg.eval_every and self.iteration % cfg.eval_every == 0:
            metrics.update(self.evaluate_matches(cfg.eval_games))
        return metrics

    def evaluate_matches(self, games: int) -> dict[str, float]:
        """A two-player game: the search in the learned model (greedy) against a random and
        a minimax player, ``games`` games each."""
        seed = derive_seed(self.config.run.seed, "eval", self.iteration)
        results = play_matches(self.net, self.config, games, seed)
        return {
            "eval/vs_random/score": results["random"].score,
            "eval/vs_minimax/score": results["minimax"].score,
            "eval/vs_minimax/loss_rate": results["minimax"].losses / results["minimax"].games,
        }

    def _self_play(self) -> list[float]:
        """``steps_per_iteration`` vector steps of every worker with the current weights, the
        temperature of each step taken from the env steps all workers will have made by
        then; the finished episodes go to the replay in worker order. Returns the finished
        episodes' returns."""
        cfg = self.config
        per_step = cfg.env.num_envs * len(self.players)
        temperatures = [self.temperature(self.env_steps + k * per_step)
                        for k in range(cfg.steps_per_iteration)]  # fmt: skip
        self.players.call_all("set_weights", self._cpu_weights())
        returns: list[float] = []
        for result in self.players.call_all("play", temperatures):
            for episode in result.episodes:
                self._store(episode)
            returns += result.returns
            self.env_steps += result.env_steps
        return returns

    def _store(self, episode: FinishedEpisode) -> None:
        """An episode's n-step value targets, then the replay."""
        cfg = self.config
        targets = episode_value_targets(torch.as_tensor(episode.rewards, dtype=torch.float64),
                                        torch.as_tensor(episode.root_values, dtype=torch.float64),
                                        episode.terminated, episode.final_value, cfg.n_step,
                                        cfg.discount)  # fmt: skip
        self._check_support(targets)
        value_targets = targets.numpy().astype(np.float32)
        self.replay.add(Episode(episode.obs, episode.actions, episode.rewards,
                                episode.root_values, episode.policies, value_targets,
                                episode.terminated))  # fmt: skip

    def _check_support(self, targets: torch.Tensor) -> None:
        largest = float(value_transform(targets.abs().max()))
        if largest > self.config.support_size:
            raise ConfigError(
                f"muzero's value targets reach {float(targets.abs().max()):.1f}, "
                f"{largest:.2f} after the value transform: support_size = "
                f"{self.config.support_size} is too small; use support_size >= "
                f"{math.ceil(largest)}"
            )

    def _update(self) -> dict[str, float]:
        cfg = self.config
        totals: dict[str, float] = {}
        horizon = cfg.optim.anneal_steps or cfg.run.total_steps
        lr = scheduled(cfg.optim.lr_schedule, cfg.optim.lr, self.env_steps / horizon)
        self.learner.set_lr(lr)
        for _ in range(cfg.updates_per_iteration):
            batch = self.replay.sample(cfg.batch_size, cfg.unroll_steps, cfg.priority_beta)
            parts, errors = self.learner.update(batch)
            self.replay.update_priorities(batch.indices, errors.numpy())
            for name, part in parts.items():
                totals[name] = totals.get(name, 0.0) + float(part) / cfg.updates_per_iteration
            self.updates += 1
        return totals

    # --- deployment and checkpoints -------------------------------------------------------

    @property
    def net(self) -> MuZeroNet:
        """The trained network (a learner group's synchronized copy)."""
        return self.learner.model  # type: ignore[return-value]

    def _module(self) -> SearchPolicy:
        """The search policy around the trained network's weights."""
        if self.policy_module.net is not self.net:  # a learner group's
            self.policy_module.net.load_state_dict(self.net.state_dict())
        return self.policy_module

    def policy(self) -> ActorPolicy:
        module = copy.deepcopy(self._module())
        obs_space, action_space = self.deploy_spaces
        return ActorPolicy(module, observation_space=obs_space, action_space=action_space)

    def state_dict(self) -> dict[str, Any]:
        learner = self.learner.state_dict()
        return {
            "policy": {"model": self._module().state_dict(), "obs_stats": None},
            "optimizer": learner["optimizer"],
            **({"group_rng": learner["group_rng"]} if "group_rng" in learner else {}),
            "replay": self.replay.state_dict(),
            "players": self.players.call_all("state_dict"),
            "counters": [self.env_steps, self.iteration, self.updates],
        }

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        self.policy_module.load_state_dict(state["policy"]["model"])
        self.env_steps, self.iteration, self.updates = (int(c) for c in state["counters"])
        learner = {"model": self.policy_module.net.state_dict(), "optimizer": state["optimizer"],
                   "grad_steps": self.updates}  # fmt: skip
        if "group_rng" in state:
            learner["group_rng"] = state["group_rng"]
        self.learner.load_state_dict(learner)
        self.replay.load_state_dict(state["replay"])
        players = state["players"]
        if len(players) != len(self.players):
            raise ValueError(
                f"the checkpoint has {len(players)} self-play workers' episodes; resume with "
                "the run's own run.runners"
            )
        fallback = derive_seed(self.config.run.seed, "env", self.env_steps)
        exact = self.players.call_each("load_state_dict", lambda i: (players[i], fallback + i))
        return all(exact)

    def close(self) -> None:
        self.players.close()
        if isinstance(self.learner, ReplayLearnerGroup):  # its Ray actors and placement group
            self.learner.close()


def _network(config: MuZeroConfig, obs_space: gym.Space, action_space: gym.Space) -> MuZeroNet:
    """A self-play worker's network, for its env's spaces (weights come by ``set_weights``)."""
    return build_model(config, obs_space, action_space).net


def play_matches(net: MuZeroNet, config: MuZeroConfig, games: int, seed: int,
                 progress: Progress | None = None) -> dict[str, MatchResult]:  # fmt: skip
    """MuZero on a two-player game: its search against a random and a minimax player."""
    if not is_game_id(config.env.id):
        raise ConfigError(f"matches are for two-player games; {config.env.id} is not one")
    game = make_game(config.env.id)
    net.eval()
    player = LatentPlayer(game, net, config.search, config.discount, seed=seed)
    return versus_baselines(game, player, games, seed, config.minimax_depth, progress)


def evaluate_run(checkpoint: Any, games: int, seed: int,
                 progress: Progress | None = None) -> dict[str, Any]:  # fmt: skip
    """``shoal eval`` of a MuZero run on a two-player game: `play_matches`."""
    config = from_dict(MuZeroConfig, checkpoint.config)
    game = make_game(config.env.id)
    obs_space = gym.spaces.Box(-np.inf, np.inf, game.observation_shape, np.float32)
    module = build_model(config, obs_space, gym.spaces.Discrete(game.num_actions))
    module.load_state_dict(checkpoint.policy_weights)
    results = play_matches(module.net, config, games, seed, progress)
    return baseline_report(results, config.env.id, games, config.search.num_simulations,
                           config.minimax_depth)  # fmt: skip


SPECS = (
    AlgorithmSpec(
        "muzero",
        MuZeroConfig,
        MuZero,
        build_model,
        "MuZero: search in a learned model, unrolled dynamics, two-hot values, prioritized replay",
        "Discrete",
        runners=True,
        learner_groups=True,
        match_report=evaluate_run,
        deploys_search=True,
        own_spaces=True,
    ),
)
"""The names this module registers (`shoal.algos.spec`, `shoal.registry`)."""
