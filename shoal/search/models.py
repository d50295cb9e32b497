"""Models of the world that `shoal.search.mcts.search` plans in.

`GameModel` is the true model of a two-player game (`shoal.envs.games.Game`) with a network
that evaluates the positions it reaches: AlphaZero's search (Silver et al. 2018). Rewards are
the mover's, and the discount of an edge is -1 where the turn passes to the opponent (values
are always the player to move's), 0 after the game's end. `LatentModel` is MuZero's learned
model (Schrittwieser et al. 2020): the search plans in the network's hidden states. `EnvModel`
is a Gymnasium env's own dynamics through exact snapshots (planning with the true model).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from shoal.core.errors import ConfigError
from shoal.envs.games import Game
from shoal.envs.snapshot import EnvStateUnsupported, capture_env_state, restore_env_state
from shoal.losses.search import support_to_scalar
from shoal.losses.value import inverse_value_transform
from shoal.search.mcts import Expansion

Evaluator = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
"""Observations ``[B, ...]`` -> prior logits ``[B, A]`` and values ``[B]`` (a policy-value
network in inference mode)."""


def uniform_evaluator(num_actions: int) -> Evaluator:
    """No network: a uniform prior and value 0 everywhere (plain MCTS on the true model)."""

    def evaluate(obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.zeros(len(obs), num_actions), torch.zeros(len(obs))

    return evaluate


class GameModel:
    """The true model of ``game``, positions evaluated by ``evaluate`` (one batched call per
    expansion step, terminal positions left out). The trees stay on the CPU, beside the game;
    ``network_device`` is where the observations go to be evaluated."""

    def __init__(self, game: Game, evaluate: Evaluator, network_device: Any = "cpu"):
        self.game, self.evaluate = game, evaluate
        self.num_actions = game.num_actions
        self.network_device = torch.device(network_device)

    def _expand(self, states: list[Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        game, count = self.game, len(states)
        legal = torch.as_tensor(np.stack([game.legal(s) for s in states]))
        logits = torch.zeros(count, self.num_actions)
        value = torch.zeros(count)
        live = legal.any(-1).nonzero().squeeze(1)
        if live.numel():
            stacked = np.stack([game.observation(states[i]) for i in live.tolist()])
            obs = torch.as_tensor(stacked).to(self.network_device)
            with torch.inference_mode():
                live_logits, live_value = self.evaluate(obs)
            logits[live] = live_logits.float().cpu()
            value[live] = live_value.float().cpu()
        return logits, legal, value

    def root(self, states: list[Any]) -> Expansion:
        logits, legal, value = self._expand(list(states))
        return Expansion(list(states), logits, legal, value)

    def step(self, states: list[Any], actions: torch.Tensor) -> Expansion:
        game = self.game
        nxt, rewards, discounts = [], [], []
        for state, action in zip(states, actions.tolist(), strict=True):
            after, reward, done = game.play(state, action)
            nxt.append(after)
            rewards.append(reward)
            if done:
                discounts.append(0.0)
            else:
                discounts.append(1.0 if game.to_move(after) == game.to_move(state) else -1.0)
        logits, legal, value = self._expand(nxt)
        return Expansion(nxt, logits, legal, value, torch.tensor(rewards),
                         torch.tensor(discounts))  # fmt: skip


class LatentModel:
    """MuZero's learned model (`shoal.nn.muzero.MuZeroNet`) for the search: the roots are
    observations, every node a hidden state (kept as one ``[B, N, L]`` array), every edge's
    reward and every node's value the network's (decoded from its support), discount
    ``discount`` on every edge. ``legal`` ``[B, A]`` restricts the roots' moves (deeper nodes
    allow every action, as in MuZero)."""

    def __init__(self, net: Any, discount: float, legal: torch.Tensor | None = None):
        self.net, self.discount, self.legal = net, discount, legal
        self.num_actions = net.num_actions
        self.state_shape = (net.latent,)
        self.device = next(net.parameters()).device

    def _all_legal(self, count: int) -> torch.Tensor:
        return torch.ones(count, self.num_actions, dtype=torch.bool, device=self.device)

    @torch.inference_mode()
    def root(self, obs: torch.Tensor) -> Expansion:
        state, logits, value = self.net.initial(obs.to(self.device))
        legal = self._all_legal(len(obs)) if self.legal is None else self.legal.to(self.device)
        return Expansion(state, logits, legal, decode(value))

    @torch.inference_mode()
    def step(self, states: torch.Tensor, actions: torch.Tensor) -> Expansion:
        state, reward, logits, value = self.net.recurrent(states, actions.to(self.device))
        discount = torch.full((len(states),), self.discount, device=self.device)
        return Expansion(state, logits, self._all_legal(len(states)), decode(value),
                         decode(reward), discount)  # fmt: skip


def decode(logits: torch.Tensor) -> torch.Tensor:
    """Scalars from logits over a transformed support (MuZero's value and reward heads)."""
    return inverse_value_transform(support_to_scalar(logits.float()))


class EnvModel:
    """The true model of a Gymnasium env through exact snapshots of its state
    (`shoal.envs.snapshot`): a node's state is a snapshot, and a step restores it into a
    scratch env, steps it and snapshots the result. Envs whose state lives in a native
    simulator (MuJoCo, Box2D, ALE) cannot be snapshotted this way and are refused;
    pure-Python envs (classic control, toy text) can. A leaf is valued by
    ``rollout_steps`` uniformly random steps from it (discounted; 0 steps: value 0). The
    episode's end (terminated or truncated) ends the plan there (discount 0)."""

    def __init__(self, make: Callable[[], Any], discount: float, rollout_steps: int = 0,
                 seed: int = 0):  # fmt: skip
        self.scratch = make()
        self.scratch.reset(seed=seed)
        space = self.scratch.action_space
        if not hasattr(space, "n"):
            raise ConfigError(f"planning searches over discrete actions, not {space}")
        try:
            capture_env_state(self.scratch)
        except EnvStateUnsupported as err:
            reason = str(err).split(";")[0]
            raise ConfigError(
                f"this env cannot be planned in with its true model: {reason}. Planning "
                "snapshots the env's Python state, which pure-Python envs (classic control, "
                "toy text, your own) hold whole; MuJoCo, Box2D and Atari keep theirs in native "
                "simulators"
            ) from err
        self.num_actions = int(space.n)
        self.discount, self.rollout_steps = discount, rollout_steps
        self.rng = np.random.default_rng(seed)

    def _value(self) -> float:
        """A random rollout's discounted return from the scratch env's state."""
        total, scale = 0.0, 1.0
        for _ in range(self.rollout_steps):
            _, reward, terminated, truncated, _ = self.scratch.step(
                int(self.rng.integers(self.num_actions))
            )
            total += scale * float(reward)
            scale *= self.discount
            if terminated or truncated:
                break
        return total

    def _expand(self, snapshots: list[Any], ended: list[bool]) -> Expansion:
        values = []
        for snapshot, done in zip(snapshots, ended, strict=True):
            if done or self.rollout_steps == 0:
                values.append(0.0)
                continue
            restore_env_state(self.scratch, snapshot)
            values.append(self._value())
        legal = torch.tensor([[not done] * self.num_actions for done in ended])
        return Expansion(list(snapshots), torch.zeros(len(snapshots), self.num_actions), legal,
                         torch.tensor(values))  # fmt: skip

    def root(self, snapshots: list[Any]) -> Expansion:
        return self._expand(list(snapshots), [False] * len(snapshots))

    def play(self, snapshot: Any, action: int) -> tuple[Any, float, bool]:
        """``(next snapshot, reward, episode over)``."""
        restore_env_state(self.scratch, snapshot)
        _, reward, terminated, truncated, _ = self.scratch.step(int(action))
        return capture_env_state(self.scratch), float(reward), bool(terminated or truncated)

    def step(self, snapshots: list[Any], actions: torch.Tensor) -> Expansion:
        out, rewards, ended = [], [], []
        for snapshot, action in zip(snapshots, actions.tolist(), strict=True):
            nxt, reward, done = self.play(snapshot, action)
            out.append(nxt)
            rewards.append(reward)
            ended.append(done)
        expansion = self._expand(out, ended)
        discount = torch.tensor([0.0 if done else self.discount for done in ended])
        return expansion._replace(reward=torch.tensor(rewards), discount=discount)
