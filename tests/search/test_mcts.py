"""Batched MCTS against hand-computed values and an unbatched reference search: PUCT scores,
backup, min-max normalization, root noise, visit policies, tree reuse, and a tic-tac-toe
position whose winning move the search finds with the true model."""

import math

import numpy as np
import pytest
import torch

from shoal.core.errors import ConfigError
from shoal.search import Expansion, MCTSConfig, search, subtree, visit_policy
from shoal.search.gumbel import gumbel_action, halving_schedule, improved_policy
from shoal.search.mcts import add_root_noise, backup, expand, puct_scores
from shoal.search.tree import UNVISITED, empty_tree

PLAIN = MCTSConfig(num_simulations=1, dirichlet_fraction=0.0, normalize_values=False)


class ToyModel:
    """A deterministic one-player model over integer states: ``num_actions`` actions, reward
    and prior logits hashed from (state, action), value from the state; state 0 is the root."""

    def __init__(self, num_actions=3, discount=0.9):
        self.num_actions, self.discount = num_actions, discount

    def _evaluate(self, states):
        rng = [np.random.default_rng(s % (2**32)) for s in states]
        logits = torch.tensor(np.array([r.normal(size=self.num_actions) for r in rng]),
                              dtype=torch.float32)  # fmt: skip
        value = torch.tensor([float(np.sin(s % 1000)) for s in states])
        legal = torch.ones(len(states), self.num_actions, dtype=torch.bool)
        return logits, legal, value

    def root(self, states):
        logits, legal, value = self._evaluate(states)
        return Expansion(list(states), logits, legal, value)

    def step(self, states, actions):
        nxt = [s * 7 + int(a) + 1 for s, a in zip(states, actions.tolist(), strict=True)]
        logits, legal, value = self._evaluate(nxt)
        reward = torch.tensor([float(np.cos(s % 997)) for s in nxt])
        discount = torch.full((len(nxt),), self.discount)
        return Expansion(nxt, logits, legal, value, reward, discount)


def test_puct_scores_by_hand_on_a_three_node_tree():
    tree = empty_tree(1, 4, 2)
    tree.size[0], tree.node_visits[0, 0] = 2, 2
    tree.prior[0, 0] = torch.tensor([0.7, 0.3])
    tree.legal[0, 0] = True
    tree.children[0, 0, 0] = 1
    tree.child_visits[0, 0, 0], tree.child_value[0, 0, 0] = 1, 0.5
    tree.child_reward[0, 0, 0], tree.child_discount[0, 0, 0] = 0.2, 0.9
    scale = 1.25 + math.log((2 + 19652 + 1) / 19652)
    want = [0.2 + 0.9 * 0.5 + 0.7 * math.sqrt(2) / 2 * scale, 0.0 + 0.3 * math.sqrt(2) / 1 * scale]
    got = puct_scores(tree, torch.tensor([0]), PLAIN)[0]
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)
    tree.legal[0, 0, 1] = False  # an illegal action never scores
    assert puct_scores(tree, torch.tensor([0]), PLAIN)[0, 1] == -math.inf
    # Min-max normalized: the one visited edge value (0.65) is both bounds -> left as it is;
    # with bounds 0.15 and 1.15 it becomes 0.5.
    tree.q_min[0], tree.q_max[0] = 0.15, 1.15
    normalized = puct_scores(tree, torch.tensor([0]), MCTSConfig(num_simulations=1))[0, 0]
    np.testing.assert_allclose(float(normalized), 0.5 + 0.7 * math.sqrt(2) / 2 * scale, rtol=1e-6)


def test_backup_by_hand():
    """Root value 1.0 (one visit); expand action 1 to a node of value 2.0 through reward 0.5
    and discount 0.9: the new node holds 2.0, the edge 2.0 and one visit, the root
    (1.0 + 0.5 + 0.9 * 2.0) / 2 = 1.65 over two visits, the bounds 2.3 and 2.3."""
    tree = empty_tree(1, 3, 2)
    tree.size[0], tree.node_visits[0, 0], tree.node_value[0, 0] = 1, 1, 1.0
    tree.legal[0, 0], tree.states[0][0] = True, 0

    class Fixed(ToyModel):
        def step(self, states, actions):
            out = super().step(states, actions)
            return out._replace(value=torch.tensor([2.0]), reward=torch.tensor([0.5]),
                                discount=torch.tensor([0.9]))  # fmt: skip

    leaves = expand(tree, Fixed(2), torch.tensor([0]), torch.tensor([1]))
    assert leaves.tolist() == [1] and tree.children[0, 0, 1] == 1 and tree.parent[0, 1] == 0
    backup(tree, leaves)
    assert tree.node_visits[0].tolist()[:2] == [2, 1]
    np.testing.assert_allclose(tree.node_value[0, :2].numpy(), [1.65, 2.0], rtol=1e-6)
    assert tree.child_visits[0, 0].tolist() == [0, 1] and float(tree.child_value[0, 0, 1]) == 2.0
    np.testing.assert_allclose([float(tree.q_min[0]), float(tree.q_max[0])], [2.3, 2.3])


def test_root_noise_and_temperature():
    tree = empty_tree(2, 2, 4)
    tree.prior[:, 0] = torch.tensor([0.25, 0.25, 0.5, 0.0])
    tree.legal[:, 0] = torch.tensor([True, True, True, False])
    before = tree.prior[:, 0].clone()
    add_root_noise(tree, MCTSConfig(dirichlet_fraction=0.0), torch.Generator().manual_seed(0))
    assert torch.equal(tree.prior[:, 0], before)
    add_root_noise(tree, MCTSConfig(dirichlet_fraction=0.25), torch.Generator().manual_seed(0))
    noisy = tree.prior[:, 0]
    torch.testing.assert_close(noisy.sum(-1), torch.ones(2))
    assert (noisy[:, 3] == 0).all() and not torch.equal(noisy, before)
    assert (noisy[:, :3] >= 0.75 * before[:, :3] - 1e-6).all()  # at least 1 - fraction
    tree.child_visits[:, 0] = torch.tensor([1, 3, 0, 0])
    np.testing.assert_allclose(visit_policy(tree, 1.0)[0].numpy(), [0.25, 0.75, 0, 0])
    np.testing.assert_allclose(visit_policy(tree, 0.5)[0].numpy(), [0.1, 0.9, 0, 0])
    np.testing.assert_allclose(visit_policy(tree, 0.0)[0].numpy(), [0, 1, 0, 0])


# --- an unbatched reference search --------------------------------------------------------


class Node:
    def __init__(self, state, prior, value):
        self.state, self.prior, self.raw = state, prior, value
        self.visits, self.value = 1, value
        self.children, self.edges = {}, {}  # action -> Node; action -> (reward, discount)


def reference_search(model, state, config, sims):
    """A one-tree-at-a-time MCTS with Python nodes and the same rules."""
    out = model.root([state])
    prior = torch.softmax(out.prior_logits[0], -1).tolist()
    root = Node(state, prior, float(out.value[0]))
    bounds = [math.inf, -math.inf]
    for _ in range(sims):
        node, path = root, [root]
        while True:
            scale = config.c1 + math.log((node.visits + config.c2 + 1) / config.c2)
            scores = []
            for a in range(model.num_actions):
                if a in node.children:
                    r, d = node.edges[a]
                    q = r + d * node.children[a].value
                    n = node.children[a].visits
                else:  # an unvisited edge: the node's own mean value
                    q, n = node.value, 0
                if config.normalize_values and bounds[1] > bounds[0]:
                    q = min(max((q - bounds[0]) / (bounds[1] - bounds[0]), 0.0), 1.0)
                scores.append(q + node.prior[a] * math.sqrt(node.visits) / (1 + n) * scale)
            a = int(np.argmax(scores))
            if a not in node.children:
                break
            node = node.children[a]
            path.append(node)
        out = model.step([node.state], torch.tensor([a]))
        child = Node(out.states[0], torch.softmax(out.prior_logits[0], -1).tolist(),
                     float(out.value[0]))  # fmt: skip
        node.children[a] = child
        node.edges[a] = (float(out.reward[0]), float(out.discount[0]))
        g = child.raw
        for parent, kid in zip(reversed(path), reversed([*path[1:], child]), strict=True):
            action = next(k for k, v in parent.children.items() if v is kid)
            r, d = parent.edges[action]
            q = r + d * kid.value
            bounds[0], bounds[1] = min(bounds[0], q), max(bounds[1], q)
            g = r + d * g
            parent.value = (parent.value * parent.visits + g) / (parent.visits + 1)
            parent.visits += 1
    return root


@pytest.mark.parametrize("normalize", [True, False])
def test_the_batched_search_equals_an_unbatched_reference(normalize):
    model = ToyModel(num_actions=3)
    config = MCTSConfig(num_simulations=40, dirichlet_fraction=0.0, normalize_values=normalize)
    roots = [0, 5, 11, 42]
    tree = search(model, roots, config)
    for b, state in enumerate(roots):
        ref = reference_search(model, state, config, 40)
        visits = [ref.children[a].visits if a in ref.children else 0 for a in range(3)]
        assert tree.child_visits[b, 0].tolist() == visits
        np.testing.assert_allclose(float(tree.node_value[b, 0]), ref.value, rtol=1e-5)
        assert int(tree.node_visits[b, 0]) == 41 == ref.visits


def test_a_reused_tree_is_the_subtree_of_the_previous_search():
    model = ToyModel(num_actions=3)
    config = MCTSConfig(num_simulations=30, dirichlet_fraction=0.0)
    tree = search(model, [0, 3], config)
    actions = visit_policy(tree, 0.0).argmax(-1)
    reused = subtree(tree, actions)
    for b in range(2):
        old_root = int(tree.children[b, 0, actions[b]])
        assert reused.states[b][0] == tree.states[b][old_root]
        assert int(reused.node_visits[b, 0]) == int(tree.node_visits[b, old_root])
        assert torch.equal(reused.child_visits[b, 0], tree.child_visits[b, old_root])
        assert int(reused.parent[b, 0]) == UNVISITED
        assert int(reused.size[b]) == int(tree.node_visits[b, old_root])  # one node a visit
        # every kept node's parent is kept and earlier
        n = int(reused.size[b])
        assert (reused.parent[b, 1:n] < torch.arange(1, n)).all()
    more = search(model, [None, None], config, tree=reused)  # goes on from the subtrees
    assert (more.node_visits[:, 0] == reused.node_visits[:, 0] + 30).all()


def test_bad_settings_are_refused():
    with pytest.raises(ConfigError, match="num_simulations"):
        MCTSConfig(num_simulations=0)
    with pytest.raises(ConfigError, match="dirichlet_fraction"):
        MCTSConfig(dirichlet_fraction=1.5)


# --- the true model of a game --------------------------------------------------------------

LINES = [(0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6)]


def winner(board):
    for i, j, k in LINES:
        if board[i] != 0 and board[i] == board[j] == board[k]:
            return board[i]
    return 0


class TicTacToe:
    """The true model: states are (board, player to move); the mover's win is reward +1, the
    discount -1 hands the value to the opponent; no legal action once the game is over.
    Leaves are valued 0 (no network): the search finds wins by looking ahead."""

    num_actions = 9

    def _expand(self, states):
        legal = torch.tensor([[cell == 0 and winner(b) == 0 for cell in b] for b, _ in states])
        return torch.zeros(len(states), 9), legal, torch.zeros(len(states))

    def root(self, states):
        logits, legal, value = self._expand(states)
        return Expansion(list(states), logits, legal, value)

    def step(self, states, actions):
        nxt, rewards = [], []
        for (board, player), a in zip(states, actions.tolist(), strict=True):
            board = list(board)
            board[a] = player
            rewards.append(1.0 if winner(board) == player else 0.0)
            nxt.append((tuple(board), -player))
        logits, legal, value = self._expand(nxt)
        return Expansion(nxt, logits, legal, value, torch.tensor(rewards), -torch.ones(len(nxt)))


def test_the_search_with_the_true_model_finds_the_winning_move():
    """X to move can win at 2 (top row) and must otherwise block O at 6 next turn; a second
    position where X must block O's column at 7. Both searched in one batch."""
    win = ((1, 1, 0, -1, -1, 0, 0, 0, 0), 1)  # X X _ / O O _ / _ _ _ : X wins at 2
    block = ((1, -1, 1, 0, -1, 0, 0, 0, 0), 1)  # X O X / _ O _ / _ _ _ : X blocks at 7
    config = MCTSConfig(num_simulations=400, dirichlet_fraction=0.0)
    tree = search(TicTacToe(), [win, block], config)
    assert visit_policy(tree, 0.0).argmax(-1).tolist() == [2, 7]


class LatentModel:
    """A small fixed network as a learned model: latent states [8], dynamics and prediction
    MLPs (MuZero's shape of model, random weights)."""

    num_actions, state_shape = 4, (8,)

    def __init__(self, seed=0):
        generator = torch.Generator().manual_seed(seed)
        self.dynamics = torch.randn(8 + 4, 8, generator=generator) * 0.5
        self.head = torch.randn(8, 4 + 2, generator=generator) * 0.5

    def _predict(self, latent):
        out = torch.tanh(latent) @ self.head
        legal = torch.ones(len(latent), 4, dtype=torch.bool)
        return out[:, :4], legal, out[:, 4], out[:, 5]

    def root(self, latent):
        logits, legal, value, _ = self._predict(latent)
        return Expansion(latent, logits, legal, value)

    def step(self, latent, actions):
        hot = torch.nn.functional.one_hot(actions, 4).float()
        nxt = torch.tanh(torch.cat([latent, hot], -1) @ self.dynamics)
        logits, legal, value, reward = self._predict(nxt)
        return Expansion(nxt, logits, legal, value, reward, torch.full((len(nxt),), 0.95))


class ListLatentModel(LatentModel):
    """The same model with its states as a list of tensors (the path for states of any kind)."""

    state_shape = None

    def root(self, states):
        out = super().root(torch.stack(states))
        return out._replace(states=list(out.states))

    def step(self, states, actions):
        out = super().step(torch.stack(states), actions)
        return out._replace(states=list(out.states))


def test_tensor_states_search_as_listed_states_do():
    """States kept as one [B, N, 8] array give the trees that per-node lists give, reused
    subtrees included."""
    config = MCTSConfig(num_simulations=25, dirichlet_fraction=0.0)
    roots = torch.randn(6, 8, generator=torch.Generator().manual_seed(1))
    as_tensor = search(LatentModel(), roots, config)
    as_list = search(ListLatentModel(), list(roots), config)
    assert as_tensor.embeddings is not None and as_list.embeddings is None
    for name in ("child_visits", "node_visits", "children", "parent"):
        assert torch.equal(getattr(as_tensor, name), getattr(as_list, name)), name
    torch.testing.assert_close(as_tensor.node_value, as_list.node_value)
    actions = visit_policy(as_tensor, 0.0).argmax(-1)
    again_tensor = search(LatentModel(), roots, config, tree=subtree(as_tensor, actions))
    again_list = search(ListLatentModel(), list(roots), config, tree=subtree(as_list, actions))
    assert torch.equal(again_tensor.child_visits, again_list.child_visits)


def test_the_compiled_search_equals_the_eager_one():
    """``compile`` wraps the same PUCT function in `torch.compile`: the trees are the same."""
    roots = torch.randn(5, 8, generator=torch.Generator().manual_seed(3))
    settings = {"num_simulations": 20, "dirichlet_fraction": 0.0}
    eager = search(LatentModel(), roots, MCTSConfig(**settings))
    compiled = search(LatentModel(), roots, MCTSConfig(**settings, compile=True))
    assert torch.equal(eager.child_visits, compiled.child_visits)
    torch.testing.assert_close(eager.node_value, compiled.node_value)


# --- Gumbel root selection with sequential halving -------------------------------------------


def test_halving_schedule_by_hand():
    """4 actions, 8 simulations: log2(4) = 2 phases; the first gives each of the 4 actions
    8 // (2 * 4) = 1 visit, the second each of the 2 survivors 8 // (2 * 2) = 2 more."""
    assert halving_schedule(4, 8) == [0, 0, 0, 0, 1, 1, 2, 2]
    # 3 actions, 6 simulations: 2 phases; 6 // 6 = 1 visit each, then 2 survivors 6 // 4 = 1
    # round, then rounds of the two go on
    assert halving_schedule(3, 6) == [0, 0, 0, 1, 1, 2]
    assert halving_schedule(1, 4) == [0, 1, 2, 3]  # one action takes every simulation
    assert len(halving_schedule(16, 200)) == 200


def test_gumbel_search_visits_by_sequential_halving():
    """With no generator the Gumbel noise is zero: the 4 considered actions are the 4 of
    highest prior, each visited once, then the 2 best by logits + sigma(q) twice more; the
    move is the best of those 2, and the improved policy is softmax(logits + sigma(q))."""
    model = ToyModel(num_actions=6)
    config = MCTSConfig(num_simulations=8, gumbel=True, max_considered=4)
    tree = search(model, [0, 3], config)
    logits = torch.log(tree.prior[:, 0])
    top4 = logits.topk(4, dim=-1).indices
    for b in range(2):
        visits = tree.child_visits[b, 0]
        assert int(visits.sum()) == 8
        assert set(visits.nonzero().squeeze(1).tolist()) == set(top4[b].tolist())
        assert sorted(visits.tolist()) == [0, 0, 1, 1, 3, 3]
    action = gumbel_action(tree, config)
    for b in range(2):
        assert int(tree.child_visits[b, 0, action[b]]) == 3
    policy = improved_policy(tree, config)
    torch.testing.assert_close(policy.sum(-1), torch.ones(2))
    # by hand for tree 0: sigma = (50 + max visits 3) * 1.0 * q_hat
    q = tree.child_reward[0, 0] + tree.child_discount[0, 0] * tree.child_value[0, 0]
    q = torch.where(tree.child_visits[0, 0] > 0, q, tree.node_value[0, 0])
    q_hat = ((q - tree.q_min[0]) / (tree.q_max[0] - tree.q_min[0])).clamp(0, 1)
    want = torch.softmax(logits[0] + 53.0 * q_hat, -1)
    torch.testing.assert_close(policy[0], want)


def test_gumbel_noise_changes_the_considered_actions():
    model = ToyModel(num_actions=8)
    config = MCTSConfig(num_simulations=4, gumbel=True, max_considered=2)
    seen = set()
    for seed in range(20):
        tree = search(model, [0], config, generator=torch.Generator().manual_seed(seed))
        seen.add(tuple(tree.child_visits[0, 0].nonzero().squeeze(1).tolist()))
    assert len(seen) > 3  # a sample without replacement, not always the top two
