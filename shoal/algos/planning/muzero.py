"""MuZero (Schrittwieser et al. 2020, "Mastering Atari, Go, Chess and Shogi by Planning with a
Learned Model") on single-agent Gymnasium envs with discrete actions.

One iteration: ``steps_per_iteration`` steps of ``env.num_envs`` envs, each step one batched
search in the network's hidden states (`shoal.search.models.LatentModel`), the move drawn from
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
import math
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from shoal.config import EnvConfig, ModelConfig, OptimConfig, RunConfig, check, check_positive
from shoal.data.trajectories import Episode, TrajectoryReplay
from shoal.device import resolve_device
from shoal.envs.make import make_env
from shoal.envs.snapshot import EnvStateUnsupported
from shoal.errors import ConfigError
from shoal.losses.search import (
    episode_value_targets,
    muzero_loss,
    scalar_to_support,
    value_transform,
)
from shoal.nn.distributions import Categorical
from shoal.nn.muzero import MuZeroNet
from shoal.optim import build_optimizer, minimize
from shoal.policy import ActorPolicy
from shoal.search import MCTSConfig, search, visit_policy
from shoal.search.mcts import gumbel_action, improved_policy
from shoal.search.models import LatentModel, decode
from shoal.seeding import derive_seed

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
    latent: int = 32
    """Size of the hidden state."""
    support_size: int = 25
    """``S``: values and rewards are predicted over the integers ``-S..S`` of
    ``h(x) = sign(x)(sqrt(|x| + 1) - 1) + 0.001 x``; ``S = 25`` covers returns up to about
    640 (a run stops with an error naming the size it needs if a target falls outside)."""
    discount: float = 0.997
    unroll_steps: int = 5
    """``K``: dynamics steps unrolled per sample."""
    n_step: int = 50
    """Steps of rewards in the value targets before bootstrapping."""
    steps_per_iteration: int = 8
    """Vector env steps (searches) per iteration."""
    replay_size: int = 50_000
    """Positions kept."""
    min_replay: int = 1_000
    batch_size: int = 128
    updates_per_iteration: int = 8
    value_coef: float = 0.25
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

    def __post_init__(self) -> None:
        check_positive(self, "latent", "support_size", "unroll_steps", "n_step",
                       "steps_per_iteration", "replay_size", "batch_size",
                       "updates_per_iteration")  # fmt: skip
        check(self, "discount", 0.0 < self.discount <= 1.0, "must be in (0, 1]")
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
    most visited action), so `shoal.policy.ActorPolicy` acts with search."""

    def __init__(self, net: MuZeroNet, search_config: MCTSConfig, discount: float):
        super().__init__()
        self.net, self.discount = net, discount
        self.search_config = search_config

    @torch.inference_mode()
    def distribution(self, obs: torch.Tensor, action_mask: torch.Tensor | None = None):
        model = LatentModel(self.net, self.discount, action_mask)
        tree = search(model, obs.float(), self.search_config)
        return Categorical(torch.log(visit_policy(tree, 1.0).clamp(min=1e-12)))


def build_model(config: MuZeroConfig, obs_space: gym.Space, action_space: gym.Space) -> nn.Module:
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
        self.env = make_env(cfg.env, seed=derive_seed(cfg.run.seed, "env"))
        if self.env.agents_per_env != 1:
            raise ConfigError(f"muzero plays single-agent envs; {cfg.env.id} has several agents")
        self.policy_module = build_model(cfg, self.env.observation_space, self.env.action_space)
        self.net: MuZeroNet = self.policy_module.net.to(self.device)
        self.optimizer = build_optimizer(self.net.parameters(), "adam", cfg.optim.lr,
                                         cfg.optim.eps, cfg.optim.weight_decay)  # fmt: skip
        num_actions = self.net.num_actions
        self.replay = TrajectoryReplay(cfg.replay_size, self.env.observation_space.shape,
                                       num_actions, cfg.priority_alpha,
                                       seed=derive_seed(cfg.run.seed, "replay"))  # fmt: skip
        self.rng = np.random.default_rng(derive_seed(cfg.run.seed, "moves"))
        self.noise = torch.Generator().manual_seed(derive_seed(cfg.run.seed, "root-noise"))
        self.obs = self.env.reset(seed=derive_seed(cfg.run.seed, "env"))
        self.open: list[list[tuple]] = [[] for _ in range(self.env.num_envs)]
        """Each env's episode so far: (obs, action, reward, root value, visit policy)."""
        self.env_steps = self.iteration = self.updates = 0

    def temperature(self) -> float:
        cfg = self.config
        passed = sum(self.env_steps >= step for step in cfg.temperature_steps)
        return cfg.temperatures[passed]

    # --- one iteration --------------------------------------------------------------------

    def train_iteration(self) -> dict[str, float]:
        cfg = self.config
        returns: list[float] = []
        for _ in range(cfg.steps_per_iteration):
            returns += self._self_play_step()
        metrics: dict[str, float] = {"search/temperature": self.temperature()}
        if len(self.replay) >= max(cfg.min_replay, 1):
            metrics.update(self._update())
        if returns:
            metrics["episode/return"] = float(np.mean(returns))
        self.iteration += 1
        return metrics

    def _self_play_step(self) -> list[float]:
        cfg, env = self.config, self.env
        obs = torch.as_tensor(np.asarray(self.obs, np.float32))
        self.net.eval()
        model = LatentModel(self.net, cfg.discount)
        tree = search(model, obs, cfg.search, self.noise)
        if cfg.search.gumbel:  # Gumbel MuZero: its move and its improved-policy target
            visits = improved_policy(tree, cfg.search).cpu()
            actions = gumbel_action(tree, cfg.search).cpu().numpy()
        else:
            visits = visit_policy(tree, 1.0).cpu()
            sampled = visit_policy(tree, self.temperature()).double().cpu().numpy()
            actions = np.array([self.rng.choice(len(p), p=p / p.sum()) for p in sampled])
        root_values = tree.node_value[:, 0].cpu().numpy()
        result = env.step(actions)
        for b in range(env.num_envs):
            if result.autoreset[b]:  # the reset step of next-step autoreset: not a move
                continue
            self.open[b].append((self.obs[b], actions[b], float(result.reward[b]),
                                 float(root_values[b]), visits[b].numpy()))  # fmt: skip
            if result.terminated[b] or result.truncated[b]:
                self._finish(b, bool(result.terminated[b]), result.obs[b])
        self.obs = result.obs
        self.env_steps += env.num_envs
        return [float(r) for r in result.episode_returns]

    def _finish(self, b: int, terminated: bool, final_obs: np.ndarray) -> None:
        """Env ``b``'s episode ended: its value targets, then the replay."""
        cfg = self.config
        columns = zip(*self.open[b], strict=True)
        obs, actions, rewards, values, policies = (np.stack(column) for column in columns)
        self.open[b] = []
        final_value = 0.0
        if not terminated:  # truncated: bootstrap from the final observation's value
            with torch.inference_mode():
                _, _, value = self.net.initial(torch.as_tensor(final_obs[None], dtype=torch.float32,
                                                               device=self.device))  # fmt: skip
            final_value = float(decode(value)[0])
        targets = episode_value_targets(torch.as_tensor(rewards, dtype=torch.float64),
                                        torch.as_tensor(values, dtype=torch.float64), terminated,
                                        final_value, cfg.n_step, cfg.discount)  # fmt: skip
        self._check_support(targets)
        self.replay.add(Episode(obs.astype(np.float32), actions, rewards.astype(np.float32),
                                values.astype(np.float32), policies.astype(np.float32),
                                targets.numpy().astype(np.float32), terminated))  # fmt: skip

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
        cfg, net = self.config, self.net
        support, device = cfg.support_size, self.device
        net.train()

        def two_hot(x: torch.Tensor) -> torch.Tensor:
            return scalar_to_support(value_transform(x.to(device)), support)

        totals: dict[str, float] = {}
        for _ in range(cfg.updates_per_iteration):
            batch = self.replay.sample(cfg.batch_size, cfg.unroll_steps, cfg.priority_beta)
            state, policy, value = net.initial(batch.obs.to(device))
            policies, values, rewards = [policy], [value], []
            for k in range(cfg.unroll_steps):
                state = 0.5 * state + 0.5 * state.detach()  # halve the gradient through time
                state, reward, policy, value = net.recurrent(state, batch.actions[k].to(device))
                policies.append(policy), values.append(value), rewards.append(reward)
            loss, parts = muzero_loss(
                torch.stack(policies), torch.stack(values), torch.stack(rewards),
                batch.target_policy.to(device), two_hot(batch.target_value),
                two_hot(batch.target_reward), batch.policy_mask.to(device),
                batch.value_mask.to(device), batch.reward_mask.to(device),
                batch.weights.to(device), cfg.value_coef,
            )  # fmt: skip
            minimize({"total": loss, **parts}, self.optimizer, cfg.optim.max_grad_norm)
            errors = (decode(values[0].detach()) - batch.target_value[0].to(device)).abs()
            self.replay.update_priorities(batch.indices, errors.cpu().numpy())
            for name, part in parts.items():
                totals[name] = totals.get(name, 0.0) + float(part) / cfg.updates_per_iteration
            self.updates += 1
        return totals

    # --- deployment and checkpoints -------------------------------------------------------

    def policy(self) -> ActorPolicy:
        module = copy.deepcopy(self.policy_module)
        return ActorPolicy(module, observation_space=self.env.observation_space,
                           action_space=self.env.action_space)  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        try:
            env_state = self.env.get_state()
        except EnvStateUnsupported:
            env_state = None
        return {
            "policy": {"model": self.policy_module.state_dict(), "obs_stats": None},
            "optimizer": self.optimizer.state_dict(),
            "replay": self.replay.state_dict(),
            "rng": self.rng.bit_generator.state,
            "noise": self.noise.get_state(),
            "env": env_state,
            "obs": np.array(self.obs),
            "open": [_pack(steps) for steps in self.open],
            "counters": [self.env_steps, self.iteration, self.updates],
        }

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        self.policy_module.load_state_dict(state["policy"]["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.replay.load_state_dict(state["replay"])
        self.rng.bit_generator.state = state["rng"]
        self.noise.set_state(state["noise"])
        self.env_steps, self.iteration, self.updates = (int(c) for c in state["counters"])
        if state["env"] is None:  # the episodes restart; the partial ones are dropped
            self.obs = self.env.reset(seed=derive_seed(self.config.run.seed, "env",
                                                       self.env_steps))  # fmt: skip
            self.open = [[] for _ in range(self.env.num_envs)]
            return False
        self.env.set_state(state["env"])
        self.obs = np.asarray(state["obs"]).copy()
        self.open = [_unpack(packed) for packed in state["open"]]
        return True

    def close(self) -> None:
        self.env.close()


def _pack(steps: list[tuple]) -> dict[str, Any]:
    if not steps:
        return {"length": 0}
    columns = [np.stack(c) for c in zip(*steps, strict=True)]
    return {"length": len(steps), **{name: col for name, col in zip(_COLUMNS, columns,
                                                                     strict=True)}}  # fmt: skip


def _unpack(packed: dict[str, Any]) -> list[tuple]:
    if int(packed["length"]) == 0:
        return []
    obs, actions, rewards, values, policies = (np.asarray(packed[name]) for name in _COLUMNS)
    return [(obs[i], actions[i], float(rewards[i]), float(values[i]), policies[i])
            for i in range(len(actions))]  # fmt: skip


_COLUMNS = ("obs", "actions", "rewards", "root_values", "policies")
