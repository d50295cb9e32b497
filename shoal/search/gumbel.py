"""Gumbel root selection with sequential halving (Danihelka, Guez, Schrittwieser and Silver
2022, "Policy improvement by planning with Gumbel"), the option ``MCTSConfig.gumbel`` of
`shoal.search.mcts.search`: sample the root's ``m`` best actions by ``g + logits``
(Gumbel-top-k: a sample without replacement), then sequential halving: the simulations go in
rounds to every action still considered, and after each phase the better half by
``g + logits + sigma(q)`` stays. `gumbel_action` reads the move after such a search,
`improved_policy` the policy target ``softmax(logits + sigma(completed q))``.
"""

from __future__ import annotations

import math
from typing import Protocol

import torch

from shoal.search.tree import Tree


class GumbelSettings(Protocol):
    """The fields of `shoal.search.mcts.MCTSConfig` this module reads (read-only, as the
    frozen config's are)."""

    @property
    def max_considered(self) -> int: ...

    @property
    def c_visit(self) -> float: ...

    @property
    def c_scale(self) -> float: ...


def draw_gumbel(tree: Tree, generator: torch.Generator | None) -> torch.Tensor:
    """``[B, A]`` Gumbel(0, 1) noise for the roots (zeros without a generator: the ``m``
    actions of highest prior, deterministically)."""
    shape = tree.prior[:, 0].shape
    if generator is None:
        return torch.zeros(shape, device=tree.prior.device)
    uniform = torch.rand(shape, generator=generator, dtype=torch.float64)
    return (-torch.log(-torch.log(uniform.clamp(1e-12, 1 - 1e-12)))).float().to(tree.prior.device)


def halving_schedule(considered: int, simulations: int) -> list[int]:
    """Sequential halving as a list: entry ``k`` is the visit count (within this search) that
    the root action taken by simulation ``k`` has before it. Each of the
    ``ceil(log2(considered))`` phases gives each remaining action
    ``max(1, simulations // (phases * remaining))`` visits, then halves the remaining (down
    to two); once the schedule is spent the survivors go on in rounds."""
    if considered <= 1:
        return list(range(simulations))
    phases = math.ceil(math.log2(considered))
    out: list[int] = []
    remaining, level = considered, 0
    while len(out) < simulations:
        rounds = max(1, simulations // (phases * remaining))
        for _ in range(rounds):
            out += [level] * remaining
            level += 1
        remaining = max(2, remaining // 2)
    return out[:simulations]


def halving_schedules(max_considered: int, simulations: int) -> torch.Tensor:
    """``[max_considered + 1, simulations]``: `halving_schedule` for every ``m`` up to
    ``max_considered`` (row ``m``; row 0 unused)."""
    rows = [halving_schedule(max(m, 1), simulations) for m in range(max_considered + 1)]
    return torch.tensor(rows, dtype=torch.long)


def completed_q(tree: Tree) -> torch.Tensor:
    """``[B, A]``: the roots' edge values ``r + discount * V``, unvisited ones completed with
    the root's mean value, min-max normalized to [0, 1] by the tree's bounds."""
    visits = tree.child_visits[:, 0]
    q = tree.child_reward[:, 0] + tree.child_discount[:, 0] * tree.child_value[:, 0]
    q = torch.where(visits > 0, q, tree.node_value[:, 0:1])
    low, high = tree.q_min[:, None], tree.q_max[:, None]
    spread = high - low
    return torch.where(spread > 0, ((q - low) / spread.clamp(min=1e-12)).clamp(0, 1), 0.5)


def _sigma(tree: Tree, config: GumbelSettings) -> torch.Tensor:
    """``sigma(q_hat) = (c_visit + max_a N(a)) * c_scale * q_hat`` at the roots, ``[B, A]``."""
    most = tree.child_visits[:, 0].max(-1, keepdim=True).values.float()
    return (config.c_visit + most) * config.c_scale * completed_q(tree)


def _root_logits(tree: Tree) -> torch.Tensor:
    prior = tree.prior[:, 0]
    return torch.log(prior.clamp(min=1e-30)).masked_fill(~tree.legal[:, 0], float("-inf"))


def halving_choice(
    tree: Tree, config: GumbelSettings, schedules: torch.Tensor, k: int
) -> torch.Tensor:
    """The root action of simulation ``k`` in every tree: among the actions whose visits in
    this search equal the schedule's count for simulation ``k``, the best by
    ``g + logits + sigma(q)``."""
    assert tree.gumbel is not None and tree.search_start is not None, "a Gumbel search's tree"
    legal = tree.legal[:, 0]
    considered = legal.sum(-1).clamp(max=config.max_considered, min=1)
    want = schedules.to(considered.device)[considered, k]  # [B]
    visits = tree.child_visits[:, 0] - tree.search_start
    score = tree.gumbel + _root_logits(tree) + _sigma(tree, config)
    candidates = legal & (visits == want[:, None])
    # Where no action has exactly that count (all legal actions fewer than m), the least
    # visited legal ones are the candidates.
    fewest = visits.masked_fill(~legal, torch.iinfo(visits.dtype).max).min(-1, keepdim=True)
    fallback = legal & (visits == fewest.values)
    candidates = torch.where(candidates.any(-1, keepdim=True), candidates, fallback)
    return score.masked_fill(~candidates, float("-inf")).argmax(-1)


def gumbel_action(tree: Tree, config: GumbelSettings) -> torch.Tensor:
    """``[B]``: the move after a Gumbel search: among the most visited root actions of the
    search, the best by ``g + logits + sigma(q)``."""
    assert tree.gumbel is not None and tree.search_start is not None, "a Gumbel search's tree"
    legal = tree.legal[:, 0]
    visits = (tree.child_visits[:, 0] - tree.search_start).masked_fill(~legal, -1)
    most = visits == visits.max(-1, keepdim=True).values
    score = tree.gumbel + _root_logits(tree) + _sigma(tree, config)
    return score.masked_fill(~most, float("-inf")).argmax(-1)


def improved_policy(tree: Tree, config: GumbelSettings) -> torch.Tensor:
    """``[B, A]``: Gumbel MuZero's policy target ``softmax(logits + sigma(completed q))`` over
    the legal root actions."""
    return torch.softmax(_root_logits(tree) + _sigma(tree, config), dim=-1)
