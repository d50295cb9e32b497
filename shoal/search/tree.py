"""A batch of search trees as preallocated arrays: ``B`` trees of up to ``N`` nodes each,
never a Python object per node (the layout of DeepMind's mctx, written for PyTorch).

Node 0 of every tree is its root. A node's children are indexed by action: ``children[b, n, a]``
is the node reached by taking ``a`` at node ``n`` (``UNVISITED`` until it is expanded), and
the per-edge statistics (``child_visits``, ``child_reward``, ``child_discount``,
``child_value``) live on the parent, so that selecting among a node's children reads one row.
Nodes are allocated in order, so a node's parent always has a smaller index.

Values are those of the player to move at a node. A two-player zero-sum game is searched with
discount -1 (the next node's value is the opponent's), so one backup rule serves one-player
planning and two-player games alike.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch

UNVISITED = -1
"""``children`` of an edge that has not been expanded; ``parent`` of a root."""

ROW_FIELDS = ("size", "q_min", "q_max", "gumbel", "search_start")
"""Fields with one row per tree, not one per node."""


@dataclass
class Tree:
    """``B`` trees of capacity ``N`` nodes and ``A`` actions (shapes in brackets)."""

    node_visits: torch.Tensor  # [B, N] int
    node_value: torch.Tensor  # [B, N] mean of the backed-up returns through the node
    raw_value: torch.Tensor  # [B, N] the model's value estimate when the node was expanded
    parent: torch.Tensor  # [B, N] int, UNVISITED for the root and unused nodes
    action_from_parent: torch.Tensor  # [B, N] int
    children: torch.Tensor  # [B, N, A] int, UNVISITED where not expanded
    prior: torch.Tensor  # [B, N, A] the policy's probabilities (0 for illegal actions)
    legal: torch.Tensor  # [B, N, A] bool
    child_visits: torch.Tensor  # [B, N, A] int
    child_reward: torch.Tensor  # [B, N, A]
    child_discount: torch.Tensor  # [B, N, A]
    child_value: torch.Tensor  # [B, N, A] node_value of the child (0 where unvisited)
    size: torch.Tensor  # [B] int, nodes allocated in each tree
    q_min: torch.Tensor  # [B] the smallest edge value r + discount * v seen in the tree
    q_max: torch.Tensor  # [B] the largest
    states: list[list[Any]]
    """``states[b][n]``: the model's state at node ``n`` of tree ``b`` (an env snapshot),
    ``None`` where not expanded; unused when the states are tensors (``embeddings``)."""
    embeddings: torch.Tensor | None = None
    """``[B, N, ...]``: the states of a model whose states are tensors of one shape (a learned
    model's latent states), kept as one array so that no step loops over the trees."""
    gumbel: torch.Tensor | None = None
    """``[B, A]``: the Gumbel noise of the last search's root, when it chose its root actions
    by sequential halving (`shoal.search.mcts.MCTSConfig.gumbel`)."""
    search_start: torch.Tensor | None = None
    """``[B, A]``: the root's child visits when the last search started (a reused tree has
    some already)."""

    @property
    def batch(self) -> int:
        return self.node_visits.shape[0]

    @property
    def capacity(self) -> int:
        return self.node_visits.shape[1]

    @property
    def num_actions(self) -> int:
        return self.children.shape[2]


def empty_tree(
    batch: int,
    capacity: int,
    num_actions: int,
    device: Any = "cpu",
    state_shape: tuple[int, ...] | None = None,
) -> Tree:
    """``batch`` trees with no nodes yet; ``state_shape``: the shape of tensor states (kept in
    ``embeddings``), or None for states of any kind (kept in ``states``)."""

    def zeros(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.zeros(*shape, dtype=dtype, device=device)

    def unvisited(*shape: int) -> torch.Tensor:
        return torch.full(shape, UNVISITED, dtype=torch.long, device=device)

    b, n, a = batch, capacity, num_actions
    return Tree(
        node_visits=zeros(b, n, dtype=torch.long),
        node_value=zeros(b, n),
        raw_value=zeros(b, n),
        parent=unvisited(b, n),
        action_from_parent=unvisited(b, n),
        children=unvisited(b, n, a),
        prior=zeros(b, n, a),
        legal=torch.zeros(b, n, a, dtype=torch.bool, device=device),
        child_visits=zeros(b, n, a, dtype=torch.long),
        child_reward=zeros(b, n, a),
        child_discount=zeros(b, n, a),
        child_value=zeros(b, n, a),
        size=zeros(b, dtype=torch.long),
        q_min=torch.full((b,), float("inf"), device=device),
        q_max=torch.full((b,), float("-inf"), device=device),
        states=[[None] * n for _ in range(b)] if state_shape is None else [],
        embeddings=None if state_shape is None else zeros(b, n, *state_shape),
    )


def grow(tree: Tree, capacity: int) -> Tree:
    """The same trees with room for ``capacity`` nodes (never fewer than they hold)."""
    if capacity <= tree.capacity:
        return tree
    shape = None if tree.embeddings is None else tuple(tree.embeddings.shape[2:])
    bigger = empty_tree(tree.batch, capacity, tree.num_actions, tree.node_visits.device, shape)
    out: dict[str, Any] = {}
    for field in fields(Tree):
        name = field.name
        old, new = getattr(tree, name), getattr(bigger, name)
        if old is None:
            out[name] = None
        elif name == "states" and tree.embeddings is not None:
            out[name] = []
        elif name == "states":
            out[name] = [row + [None] * (capacity - tree.capacity) for row in old]
        elif name in ROW_FIELDS:
            out[name] = old.clone()
        else:
            new[:, : tree.capacity] = old
            out[name] = new
    return Tree(**out)


def subtree(tree: Tree, actions: torch.Tensor) -> Tree:
    """Tree reuse: in each tree ``b``, the subtree under the root's child ``actions[b]``
    becomes the whole tree, its nodes renumbered in their old order (the child is the new
    root). A tree whose chosen child was never expanded starts empty."""
    b_index = torch.arange(tree.batch, device=actions.device)
    new_root = tree.children[b_index, 0, actions]  # [B]
    keep = torch.zeros_like(tree.parent, dtype=torch.bool)
    has_root = new_root != UNVISITED
    keep[b_index[has_root], new_root[has_root]] = True
    # Parents come before children, so one pass in index order finds every descendant.
    for n in range(1, tree.capacity):
        parents = tree.parent[:, n]
        inside = parents != UNVISITED
        keep[inside, n] |= keep[inside, parents[inside]]
    new_index = torch.cumsum(keep.long(), dim=1) - 1  # [B, N]: where a kept node goes
    new_index[~keep] = UNVISITED
    shape = None if tree.embeddings is None else tuple(tree.embeddings.shape[2:])
    out = empty_tree(tree.batch, tree.capacity, tree.num_actions, tree.node_visits.device, shape)
    for b in range(tree.batch):
        old = keep[b].nonzero().squeeze(1)
        if old.numel() == 0:
            continue
        count = old.numel()
        for name in ("node_visits", "node_value", "raw_value", "action_from_parent"):
            getattr(out, name)[b, :count] = getattr(tree, name)[b, old]
        for name in ("prior", "legal", "child_visits", "child_reward", "child_discount",
                     "child_value"):  # fmt: skip
            getattr(out, name)[b, :count] = getattr(tree, name)[b, old]
        remap = new_index[b]
        parents = tree.parent[b, old]
        out.parent[b, :count] = torch.where(parents == UNVISITED, UNVISITED,
                                            remap[parents.clamp(min=0)])  # fmt: skip
        out.parent[b, 0] = UNVISITED
        out.action_from_parent[b, 0] = UNVISITED
        children = tree.children[b, old]
        out.children[b, :count] = torch.where(children == UNVISITED, UNVISITED,
                                              remap[children.clamp(min=0)])  # fmt: skip
        if tree.embeddings is None:
            out.states[b][:count] = [tree.states[b][int(i)] for i in old]
        else:
            assert out.embeddings is not None  # (made like the tree's)
            out.embeddings[b, :count] = tree.embeddings[b, old]
        out.size[b] = count
        out.q_min[b], out.q_max[b] = tree.q_min[b], tree.q_max[b]
    return out


def clear(tree: Tree, rows: torch.Tensor) -> Tree:
    """The same trees with the trees at ``rows`` (indices) emptied: their next search starts
    from a new root (a finished game's tree, say)."""
    if rows.numel() == 0:
        return tree
    shape = None if tree.embeddings is None else tuple(tree.embeddings.shape[2:])
    blank = empty_tree(len(rows), tree.capacity, tree.num_actions, tree.node_visits.device, shape)
    for field in fields(Tree):
        name = field.name
        if name == "states":
            for b in rows.tolist():
                if tree.embeddings is None:
                    tree.states[b] = [None] * tree.capacity
        elif name in ("gumbel", "search_start"):
            continue  # describe the last search only
        elif getattr(tree, name) is not None:
            getattr(tree, name)[rows] = getattr(blank, name)
    return tree


ARRAYS = tuple(f.name for f in fields(Tree) if f.name not in ("states",))


def tree_arrays(tree: Tree) -> dict[str, torch.Tensor | None]:
    """The tree's arrays (for a checkpoint); per-node states of any kind are left out:
    `restore_tree` replays them from the roots."""
    return {name: getattr(tree, name) for name in ARRAYS}


def restore_tree(
    arrays: dict[str, torch.Tensor | None],
    roots: list[Any],
    step: Any,
) -> Tree:
    """A tree from `tree_arrays`, its per-node states rebuilt: node 0 of tree ``b`` is
    ``roots[b]``, and every other node is ``step(parent's state, action from the parent)``
    (parents come first, so one pass in index order rebuilds them all)."""
    values: dict[str, Any] = {name: arrays[name] for name in ARRAYS}
    batch, capacity = values["node_visits"].shape
    states: list[list[Any]] = []
    if values["embeddings"] is None:
        for b in range(batch):
            row: list[Any] = [None] * capacity
            size = int(values["size"][b])
            if size:
                row[0] = roots[b]
            for n in range(1, size):
                parent = int(values["parent"][b, n])
                row[n] = step(row[parent], int(values["action_from_parent"][b, n]))
            states.append(row)
    return Tree(**values, states=states)
