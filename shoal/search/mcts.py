"""Batched Monte-Carlo tree search: PUCT selection, expansion by a model, backup with min-max
normalized values, Dirichlet noise at the root, visit-count policies with a temperature, and
tree reuse between moves. Every step is an array operation over a batch of trees
(`shoal.search.tree.Tree`), so ``B`` searches cost about one search's Python overhead.

The selection rule is MuZero's (Schrittwieser et al. 2020, "Mastering Atari, Go, Chess and
Shogi by Planning with a Learned Model", appendix B):

    a = argmax_a  Q(s, a) + P(s, a) * sqrt(N(s)) / (1 + N(s, a)) * (c1 + log((N(s) + c2 + 1) / c2))

with ``Q(s, a) = r(s, a) + discount(s, a) * V(child)`` normalized by the smallest and largest
edge values seen in the tree, and ``N(s)`` the node's visits (its expansion counts as one).
An unvisited edge's Q is the node's own mean value (as mctx completes it), not MuZero's 0: on
the normalized scale 0 is the worst value in the tree, which makes a search with few
simulations stick with the first moves it tried. Root noise is AlphaZero's (Silver et al.
2018, "A general reinforcement learning algorithm that masters chess, shogi, and Go through
self-play"):
``P = (1 - fraction) * P + fraction * Dirichlet(alpha)`` over the legal actions.

A model is anything with the two methods of `Model`: the true environment through its
snapshots (planning, AlphaZero) or a learned one (MuZero).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple, Protocol

import torch

from shoal.config.checks import check, check_positive
from shoal.config.usage import Gate
from shoal.core.errors import ConfigError
from shoal.search.gumbel import draw_gumbel, halving_choice, halving_schedules
from shoal.search.tree import UNVISITED, Tree, empty_tree, grow


class Expansion(NamedTuple):
    """What a model says about a batch of states: ``[B, A]`` prior logits and legal actions,
    ``[B]`` value estimates (of the player to move there), and for a step the reward and
    discount of the edge into them (discount -1 in a two-player zero-sum game, 0 after a
    terminal state)."""

    states: list[Any] | torch.Tensor
    prior_logits: torch.Tensor
    legal: torch.Tensor
    value: torch.Tensor
    reward: torch.Tensor | None = None
    discount: torch.Tensor | None = None


class Model(Protocol):
    """``num_actions``; optionally ``state_shape`` (its states are tensors of that shape, kept
    in one array; roots then come as a ``[B, ...]`` tensor) and ``device``."""

    @property
    def num_actions(self) -> int: ...

    def root(self, states: Any) -> Expansion:
        """Evaluate the roots (``reward`` and ``discount`` unused): a list of states, or a
        ``[B, ...]`` tensor of a model with ``state_shape``."""
        ...

    def step(self, states: Any, actions: torch.Tensor) -> Expansion:
        """Take ``actions`` ``[B]`` from ``states`` and evaluate where they lead."""
        ...


@dataclass(frozen=True)
class MCTSConfig:
    """Search settings."""

    num_simulations: int = 50
    """Simulations per search (each expands one node)."""
    c1: float = 1.25
    """PUCT's exploration weight (MuZero's c1)."""
    c2: float = 19652.0
    """PUCT's visit-count scale (MuZero's c2): exploration grows slowly past it."""
    dirichlet_alpha: float = 0.3
    """Concentration of the root noise (0.3 for chess in AlphaZero; larger for fewer moves)."""
    dirichlet_fraction: float = 0.25
    """Weight of the root noise in the root's prior (0: no noise, for evaluation)."""
    normalize_values: bool = True
    """Min-max normalize Q over the tree (for rewards of any scale); off: raw Q."""
    gumbel: bool = False
    """Choose the root's actions by Gumbel sampling and sequential halving (Danihelka et al.
    2022) instead of PUCT and root noise; read the move and the policy target with
    `shoal.search.gumbel`'s `gumbel_action` and `improved_policy`."""
    max_considered: int = 16
    """Gumbel: the root actions sampled (without replacement) to halve down from."""
    c_visit: float = 50.0
    """Gumbel: ``sigma(q) = (c_visit + max_a N(a)) * c_scale * q``, the paper's 50."""
    c_scale: float = 1.0
    """Gumbel: see ``c_visit`` (the paper's 1.0)."""
    compile: bool = False
    """Compile the PUCT scoring with `torch.compile` (several seconds once per tree shape;
    then each level of the descent is one fused kernel instead of some thirty operations)."""

    GATES: ClassVar[dict[str, Gate]] = {
        **{name: Gate("gumbel", bool, "with search.gumbel")
           for name in ("max_considered", "c_visit", "c_scale")},
        "dirichlet_fraction": Gate("gumbel", lambda g: not g,
                                   "without search.gumbel (Gumbel sampling replaces root noise)"),
        "dirichlet_alpha": Gate("", lambda s: not s.gumbel and s.dirichlet_fraction > 0,
                                "with root noise (search.dirichlet_fraction > 0, no gumbel)"),
    }  # fmt: skip

    def __post_init__(self) -> None:
        if self.num_simulations < 1:
            raise ConfigError(
                f"MCTSConfig.num_simulations = {self.num_simulations} is invalid: must be >= 1"
            )
        if self.max_considered < 1:
            raise ConfigError(
                f"MCTSConfig.max_considered = {self.max_considered} is invalid: must be >= 1"
            )
        if not 0.0 <= self.dirichlet_fraction <= 1.0:
            raise ConfigError(
                f"MCTSConfig.dirichlet_fraction = {self.dirichlet_fraction} is invalid: "
                "must be in [0, 1]"
            )
        check(self, "c1", self.c1 >= 0, "must be >= 0")
        check(self, "c_visit", self.c_visit >= 0, "must be >= 0")
        check_positive(self, "c2", "dirichlet_alpha", "c_scale")


def _masked_softmax(logits: torch.Tensor, legal: torch.Tensor) -> torch.Tensor:
    logits = logits.masked_fill(~legal, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return torch.nan_to_num(probs, nan=0.0)  # a node with no legal action (terminal)


def puct_scores(tree: Tree, nodes: torch.Tensor, config: MCTSConfig) -> torch.Tensor:
    """``[B, A]``: the PUCT score of every action at ``nodes[b]`` of tree ``b``; illegal
    actions score -inf."""
    return _puct(
        tree.child_visits, tree.node_visits, tree.child_reward, tree.child_discount,
        tree.child_value, tree.node_value, tree.prior, tree.legal, tree.q_min, tree.q_max,
        nodes, config.c1, config.c2, config.normalize_values,
    )  # fmt: skip


def _puct(
    child_visits: torch.Tensor,
    node_visits: torch.Tensor,
    child_reward: torch.Tensor,
    child_discount: torch.Tensor,
    child_value: torch.Tensor,
    node_value: torch.Tensor,
    prior: torch.Tensor,
    legal: torch.Tensor,
    q_min: torch.Tensor,
    q_max: torch.Tensor,
    nodes: torch.Tensor,
    c1: float,
    c2: float,
    normalize: bool,
) -> torch.Tensor:
    """`puct_scores` on the tree's arrays (what ``compile`` compiles)."""
    b = torch.arange(child_visits.shape[0], device=nodes.device)
    visits = child_visits[b, nodes].float()
    parent_visits = node_visits[b, nodes].float()[:, None]
    q = child_reward[b, nodes] + child_discount[b, nodes] * child_value[b, nodes]
    q = torch.where(visits > 0, q, node_value[b, nodes][:, None])
    if normalize:
        low, high = q_min[:, None], q_max[:, None]
        spread = high - low
        scaled = ((q - low) / spread.clamp(min=1e-12)).clamp(0.0, 1.0)
        q = torch.where(spread > 0, scaled, q)
    scale = c1 + torch.log((parent_visits + c2 + 1.0) / c2)
    u = prior[b, nodes] * torch.sqrt(parent_visits) / (1.0 + visits) * scale
    return (q + u).masked_fill(~legal[b, nodes], float("-inf"))


_COMPILED: dict[str, Any] = {}


def _scorer(config: MCTSConfig) -> Any:
    """`_puct`, compiled by `torch.compile` when ``config.compile`` asks (one compile per
    process and tree shape; the same function either way)."""
    if not config.compile:
        return _puct
    if "puct" not in _COMPILED:
        _COMPILED["puct"] = torch.compile(_puct, dynamic=False)
    return _COMPILED["puct"]


def _set_node(tree: Tree, b: torch.Tensor, n: torch.Tensor, out: Expansion) -> None:
    tree.prior[b, n] = _masked_softmax(out.prior_logits.to(tree.prior), out.legal)
    tree.legal[b, n] = out.legal.to(tree.legal.device)
    tree.raw_value[b, n] = out.value.to(tree.raw_value)
    if tree.embeddings is not None:
        assert isinstance(out.states, torch.Tensor), "a latent model's states are a tensor"
        tree.embeddings[b, n] = out.states.to(tree.embeddings)
        return
    for i, (bb, nn) in enumerate(zip(b.tolist(), n.tolist(), strict=True)):
        tree.states[bb][nn] = out.states[i]


def _states(tree: Tree, b: torch.Tensor, n: torch.Tensor) -> Any:
    """The states at nodes ``n[i]`` of trees ``b[i]``: a tensor, or a list."""
    if tree.embeddings is not None:
        return tree.embeddings[b, n]
    return [tree.states[bb][nn] for bb, nn in zip(b.tolist(), n.tolist(), strict=True)]


def add_root_noise(tree: Tree, config: MCTSConfig, generator: torch.Generator) -> None:
    """Mix Dirichlet noise into each root's prior, over its legal actions."""
    if config.dirichlet_fraction == 0.0:
        return
    legal = tree.legal[:, 0]
    concentration = torch.full(legal.shape, config.dirichlet_alpha, dtype=torch.float64)
    gamma = torch._standard_gamma(concentration, generator=generator)  # Dirichlet by gammas
    gamma = torch.where(legal.cpu(), gamma, torch.zeros_like(gamma))
    noise = (gamma / gamma.sum(-1, keepdim=True).clamp(min=1e-30)).to(tree.prior)
    mixed = (1 - config.dirichlet_fraction) * tree.prior[:, 0] + config.dirichlet_fraction * noise
    tree.prior[:, 0] = torch.where(legal, mixed, torch.zeros_like(mixed))


def search(
    model: Model,
    roots: list[Any] | torch.Tensor,
    config: MCTSConfig,
    generator: torch.Generator | None = None,
    tree: Tree | None = None,
) -> Tree:
    """Run ``config.num_simulations`` simulations in each of ``len(roots)`` trees at once.

    ``tree``: the trees of the previous move, already cut to the chosen subtrees
    (`shoal.search.tree.subtree`); their roots are kept, with their statistics, and an empty
    one is started from ``roots``. ``generator``: draws the root noise (none without one, as
    for evaluation). Returns the trees (read the policy with `visit_policy`)."""
    batch = len(roots)
    if tree is None:
        shape = getattr(model, "state_shape", None)
        device = getattr(model, "device", "cpu")
        tree = empty_tree(batch, config.num_simulations + 1, model.num_actions, device, shape)
    tree = grow(tree, int(tree.size.max()) + config.num_simulations + 1)
    fresh = (tree.size == 0).nonzero().squeeze(1)
    if fresh.numel():
        if isinstance(roots, torch.Tensor):
            out = model.root(roots[fresh])
        else:
            out = model.root([roots[i] for i in fresh.tolist()])
        zero = torch.zeros_like(fresh)
        _set_node(tree, fresh, zero, out)
        tree.node_visits[fresh, 0] = 1
        tree.node_value[fresh, 0] = out.value.to(tree.node_value)
        tree.size[fresh] = 1
    tree.search_start = tree.child_visits[:, 0].clone()
    root_choice = None
    if config.gumbel:
        tree.gumbel = draw_gumbel(tree, generator)
        schedule = halving_schedules(config.max_considered, config.num_simulations)
        root_choice = lambda tree, k: halving_choice(tree, config, schedule, k)  # noqa: E731
    elif generator is not None:
        add_root_noise(tree, config, generator)
    for k in range(config.num_simulations):
        nodes, actions = select(tree, config, None if root_choice is None else root_choice(tree, k))
        leaves = expand(tree, model, nodes, actions)
        backup(tree, leaves)
    return tree


def select(
    tree: Tree, config: MCTSConfig, root_actions: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Descend every tree from its root by PUCT to an unexpanded edge: ``(nodes, actions)``,
    ``[B]`` each. A tree that reaches a terminal node (no legal action) stops there with
    action ``UNVISITED``: it is backed up again without an expansion. ``root_actions``
    ``[B]``: the actions to take at the roots instead of PUCT's (Gumbel's)."""
    device = tree.node_visits.device
    b = torch.arange(tree.batch, device=device)
    nodes = torch.zeros(tree.batch, dtype=torch.long, device=device)
    actions = torch.full_like(nodes, UNVISITED)
    active = torch.ones(tree.batch, dtype=torch.bool, device=device)
    scorer = _scorer(config)
    while active.any():
        terminal = ~tree.legal[b, nodes].any(-1)
        scores = scorer(
            tree.child_visits, tree.node_visits, tree.child_reward, tree.child_discount,
            tree.child_value, tree.node_value, tree.prior, tree.legal, tree.q_min, tree.q_max,
            nodes, config.c1, config.c2, config.normalize_values,
        )  # fmt: skip
        chosen = scores.argmax(-1)
        if root_actions is not None:
            chosen = torch.where(nodes == 0, root_actions, chosen)
            root_actions = None  # the root is only the first level
        child = tree.children[b, nodes, chosen]
        stop = active & (terminal | (child == UNVISITED))
        actions = torch.where(stop & ~terminal, chosen, actions)
        active &= ~stop
        nodes = torch.where(active, child, nodes)
    return nodes, actions


def expand(tree: Tree, model: Model, nodes: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """Expand edge ``actions[b]`` of ``nodes[b]`` with the model; returns the leaf to back up
    from in each tree (the new node, or the terminal node where no edge was taken)."""
    leaves = nodes.clone()
    todo = (actions != UNVISITED).nonzero().squeeze(1)
    if todo.numel() == 0:
        return leaves
    parents, taken = nodes[todo], actions[todo]
    out = model.step(_states(tree, todo, parents), taken)
    new = tree.size[todo]
    if int(new.max()) >= tree.capacity:
        raise RuntimeError("search tree is full: grow it before searching")  # a bug if seen
    _set_node(tree, todo, new, out)
    tree.parent[todo, new] = parents
    tree.action_from_parent[todo, new] = taken
    tree.children[todo, parents, taken] = new
    assert out.reward is not None and out.discount is not None, "a step's expansion"
    tree.child_reward[todo, parents, taken] = out.reward.to(tree.child_reward)
    tree.child_discount[todo, parents, taken] = out.discount.to(tree.child_discount)
    tree.size[todo] += 1
    leaves[todo] = new
    return leaves


def backup(tree: Tree, leaves: torch.Tensor) -> None:
    """Back the leaves' values up to the roots: each node on the path averages in the return
    ``G`` seen from it (``G <- r + discount * G`` going up), each edge takes its child's new
    mean, and the tree's min-max bounds take in the edges' new values. Every tree moves up one
    level per step, as masked whole-batch operations (a tree already at its root is left as
    it is)."""
    b = torch.arange(tree.batch, device=leaves.device)
    nodes = leaves.clone()
    value = tree.raw_value[b, nodes]
    _average_in(tree, b, nodes, value)
    while True:
        parents = tree.parent[b, nodes]
        up = parents != UNVISITED
        if not up.any():
            return
        parent = parents.clamp(min=0)
        action = tree.action_from_parent[b, nodes].clamp(min=0)
        reward = tree.child_reward[b, parent, action]
        discount = tree.child_discount[b, parent, action]
        child_mean = tree.node_value[b, nodes]
        tree.child_visits[b, parent, action] += up.long()
        edge_value = tree.child_value[b, parent, action]
        tree.child_value[b, parent, action] = torch.where(up, child_mean, edge_value)
        q = reward + discount * child_mean
        tree.q_min.copy_(torch.where(up, torch.minimum(tree.q_min, q), tree.q_min))
        tree.q_max.copy_(torch.where(up, torch.maximum(tree.q_max, q), tree.q_max))
        value = torch.where(up, reward + discount * value, value)
        visits = tree.node_visits[b, parent]
        mean = tree.node_value[b, parent]
        tree.node_value[b, parent] = torch.where(up, (mean * visits + value) / (visits + 1), mean)
        tree.node_visits[b, parent] = visits + up.long()
        nodes = torch.where(up, parents, nodes)


def _average_in(tree: Tree, b: torch.Tensor, nodes: torch.Tensor, value: torch.Tensor) -> None:
    visits = tree.node_visits[b, nodes]
    tree.node_value[b, nodes] = (tree.node_value[b, nodes] * visits + value) / (visits + 1)
    tree.node_visits[b, nodes] = visits + 1


def visit_policy(tree: Tree, temperature: float = 1.0) -> torch.Tensor:
    """``[B, A]``: each root's visit counts as a policy, ``N(a)^(1 / temperature)``
    normalized; temperature 0 puts all mass on the most visited actions (shared on ties)."""
    visits = tree.child_visits[:, 0].double()
    if temperature == 0.0:
        best = visits == visits.max(-1, keepdim=True).values
        return (best / best.sum(-1, keepdim=True)).float()
    weights = visits ** (1.0 / temperature)
    return (weights / weights.sum(-1, keepdim=True).clamp(min=1e-30)).float()
