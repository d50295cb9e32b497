"""Models of the world that `shoal.search.mcts.search` plans in.

`GameModel` is the true model of a two-player game (`shoal.envs.games.Game`) with a network
that evaluates the positions it reaches: AlphaZero's search (Silver et al. 2018). Rewards are
the mover's, and the discount of an edge is -1 where the turn passes to the opponent (values
are always the player to move's), 0 after the game's end. `LatentModel` is MuZero's learned
model (Schrittwieser et al. 2020): the search plans in the network's hidden states.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from shoal.envs.games import Game
from shoal.losses.search import inverse_value_transform, support_to_scalar
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
            obs = np.stack([game.observation(states[i]) for i in live.tolist()])
            obs = torch.as_tensor(obs).to(self.network_device)
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
