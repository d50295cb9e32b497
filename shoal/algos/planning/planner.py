"""Planning with the true model: MCTS on a Gymnasium env's own dynamics, through exact
snapshots of its state (`shoal.search.models.EnvModel`), no learning.

Every step, each of ``env.num_envs`` envs searches from a snapshot of its current state (the
searches batched as one array of trees, the subtree under the move played kept for the next
search), plays the most visited action, and the returns of the finished episodes are logged
as ``episode/return``. Nothing is learned, so there is no network to deploy: a planner acts
from the env's state, not from observations, and ``run.eval_every_steps`` stays 0 (its own
episodes are its evaluation).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
import torch

from shoal.algos.spec import AlgorithmSpec
from shoal.config import EnvConfig, RunConfig, check
from shoal.config.usage import NO_COMPILE
from shoal.core.errors import ShoalError
from shoal.core.seeding import derive_seed
from shoal.envs.ids import env_spec
from shoal.envs.snapshot import capture_env_state, restore_env_state
from shoal.search import MCTSConfig, search, subtree, visit_policy
from shoal.search.arena import choose
from shoal.search.models import EnvModel
from shoal.search.tree import Tree, clear, restore_tree, tree_arrays

__all__ = ["Planner", "PlannerConfig", "build_model"]


@dataclass(frozen=True)
class PlannerConfig:
    """Settings of planning with the true model."""

    run: RunConfig = field(default_factory=lambda: RunConfig(eval_every_steps=0))
    env: EnvConfig = field(default_factory=lambda: EnvConfig(num_envs=4))
    search: MCTSConfig = field(
        default_factory=lambda: MCTSConfig(num_simulations=50, dirichlet_fraction=0.0)
    )
    """The search at each step (no root noise: planning, not self-play)."""
    discount: float = 0.99
    """Per step, in the search's backups and the rollouts' values."""
    rollout_steps: int = 20
    """Random steps that value a new leaf (0: every leaf is worth 0)."""
    reuse_tree: bool = True
    """Start each step's search from the subtree under the action taken (its visits kept)."""

    UNUSED: ClassVar[dict[str, str]] = {
        **{f"run.{name}": "its own planned episodes are its evaluation"
           for name in ("eval_episodes", "eval_actions")},
        **NO_COMPILE,
        **{f"env.{name}": "it plans on the env's own state (exact snapshots of the raw env)"
           for name in ("normalize_obs", "normalize_reward", "clip_obs", "wrappers",
                        "vector_wrappers", "frame_stack")},
    }  # fmt: skip

    def __post_init__(self) -> None:
        check(self, "discount", 0.0 < self.discount <= 1.0, "must be in (0, 1]")
        check(self, "rollout_steps", self.rollout_steps >= 0, "must be >= 0")
        check(self.run, "eval_every_steps", self.run.eval_every_steps == 0,
              "the planner acts from env states, not observations: its own episodes are its "
              "evaluation; leave run.eval_every_steps at 0")  # fmt: skip


def build_model(config: PlannerConfig, obs_space: Any, action_space: Any) -> Any:
    raise ShoalError(
        "mcts plans with the env's true state and learns no network: there is no policy to "
        "load (its runs log the returns of the episodes it planned)"
    )


class Planner:
    """``env.num_envs`` Gymnasium envs, each playing the search's moves."""

    def __init__(self, config: PlannerConfig):
        self.config = cfg = config
        env_spec(cfg.env.id)  # an unknown id is refused with the ids that work
        kwargs: dict[str, Any] = dict(cfg.env.kwargs)
        if cfg.env.max_episode_steps is not None:
            kwargs["max_episode_steps"] = cfg.env.max_episode_steps
        make = lambda: gym.make(cfg.env.id, disable_env_checker=True, **kwargs)  # noqa: E731
        self.model = EnvModel(make, cfg.discount, cfg.rollout_steps,
                              derive_seed(cfg.run.seed, "rollouts"))  # fmt: skip
        self.envs = [make() for _ in range(cfg.env.num_envs)]
        self.deploy_spaces = (self.envs[0].observation_space, self.envs[0].action_space)
        self.episodes_started = 0
        for env in self.envs:
            self._reset(env)
        self.returns = [0.0] * len(self.envs)
        self.rng = np.random.default_rng(derive_seed(cfg.run.seed, "ties"))
        self.tree: Tree | None = None
        self.env_steps = self.iteration = 0

    def _reset(self, env: gym.Env) -> None:
        env.reset(seed=derive_seed(self.config.run.seed, "episode", self.episodes_started))
        self.episodes_started += 1

    def train_iteration(self) -> dict[str, float]:
        cfg = self.config
        roots = [capture_env_state(env) for env in self.envs]
        tree = search(self.model, roots, cfg.search, tree=self.tree)
        sample = torch.zeros(len(self.envs), dtype=torch.bool)
        actions = choose(visit_policy(tree, 1.0), sample, self.rng)
        finished, ended = [], []
        for b, env in enumerate(self.envs):
            _, reward, terminated, truncated, _ = env.step(int(actions[b]))
            self.returns[b] += float(reward)
            if terminated or truncated:
                finished.append(self.returns[b])
                ended.append(b)
                self.returns[b] = 0.0
                self._reset(env)
        self.env_steps += len(self.envs)
        self.iteration += 1
        if cfg.reuse_tree:
            self.tree = clear(subtree(tree, torch.as_tensor(actions)),
                              torch.tensor(ended, dtype=torch.long))  # fmt: skip
        metrics = {"search/root_value": float(tree.node_value[:, 0].mean())}
        if finished:
            metrics["episode/return"] = float(np.mean(finished))
        return metrics

    def policy(self) -> Any:
        return build_model(self.config, None, None)

    def state_dict(self) -> dict[str, Any]:
        return {
            "envs": [capture_env_state(env) for env in self.envs],
            "returns": list(self.returns),
            "rng": self.rng.bit_generator.state,
            "rollout_rng": self.model.rng.bit_generator.state,
            "tree": None if self.tree is None else tree_arrays(self.tree),
            "counters": [self.env_steps, self.iteration, self.episodes_started],
        }

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        for env, snapshot in zip(self.envs, state["envs"], strict=True):
            restore_env_state(env, snapshot)
        self.returns = [float(r) for r in state["returns"]]
        self.rng.bit_generator.state = state["rng"]
        self.model.rng.bit_generator.state = state["rollout_rng"]
        self.env_steps, self.iteration, self.episodes_started = map(int, state["counters"])
        roots = [capture_env_state(env) for env in self.envs]
        step = lambda s, a: self.model.play(s, a)[0]  # noqa: E731
        self.tree = None if state["tree"] is None else restore_tree(state["tree"], roots, step)
        return True

    def close(self) -> None:
        for env in self.envs:
            env.close()
        self.model.scratch.close()


SPECS = (
    AlgorithmSpec(
        "mcts",
        PlannerConfig,
        Planner,
        build_model,
        "MCTS planning with a Gymnasium env's true dynamics (exact snapshots), no learning",
        "Discrete (pure-Python envs)",
        deploys=False,
        own_spaces=True,
        gradients=False,
    ),
)
"""The names this module registers (`shoal.algos.spec`, `shoal.registry`)."""
