"""Planning with search: batched Monte-Carlo tree search over arrays of trees
(`shoal.search.tree`, `shoal.search.mcts`)."""

from shoal.search.mcts import Expansion, MCTSConfig, Model, search, visit_policy
from shoal.search.tree import Tree, subtree

__all__ = ["Expansion", "MCTSConfig", "Model", "Tree", "search", "subtree", "visit_policy"]
