"""AlphaZero's loss and MuZero's value transform and supports against hand-computed values."""

import math

import numpy as np
import torch

from shoal.losses.search import (
    alphazero_loss,
    episode_value_targets,
    muzero_loss,
    policy_cross_entropy,
    scalar_to_support,
    support_cross_entropy,
    support_to_scalar,
)
from shoal.losses.value import inverse_value_transform, value_transform


def test_policy_cross_entropy_by_hand_with_illegal_moves_left_out():
    logits = torch.tensor([[0.0, math.log(3.0), 5.0]])
    target = torch.tensor([[0.5, 0.5, 0.0]])
    legal = torch.tensor([[True, True, False]])
    # softmax over the legal moves: [1/4, 3/4]
    want = -(0.5 * math.log(0.25) + 0.5 * math.log(0.75))
    got = policy_cross_entropy(logits, target, legal)
    np.testing.assert_allclose(got.numpy(), [want], rtol=1e-6)
    # without the mask the illegal move takes probability
    assert float(policy_cross_entropy(logits, target)) > want + 1.0


def test_alphazero_loss_by_hand():
    logits = torch.zeros(2, 2)
    value = torch.tensor([0.5, -1.0])
    target_policy = torch.tensor([[1.0, 0.0], [0.25, 0.75]])
    target_value = torch.tensor([1.0, 0.0])
    loss, parts = alphazero_loss(logits, value, target_policy, target_value, value_coef=2.0)
    value_loss = (0.25 + 1.0) / 2
    policy = math.log(2.0)  # every row: -sum(t log 1/2) = log 2
    np.testing.assert_allclose(float(parts["loss/value"]), value_loss, rtol=1e-6)
    np.testing.assert_allclose(float(parts["loss/policy"]), policy, rtol=1e-6)
    np.testing.assert_allclose(float(loss), 2.0 * value_loss + policy, rtol=1e-6)


def test_value_transform_by_hand_and_inverse():
    x = torch.tensor([0.0, 3.0, -8.0, 99.0], dtype=torch.float64)
    want = [0.0, 1.0 + 0.003, -(2.0 + 0.008), 9.0 + 0.099]  # sqrt(4)-1, sqrt(9)-1, sqrt(100)-1
    np.testing.assert_allclose(value_transform(x).numpy(), want, rtol=1e-12)
    wide = torch.linspace(-5000, 5000, 1001, dtype=torch.float64)
    torch.testing.assert_close(inverse_value_transform(value_transform(wide)), wide)


def test_scalar_to_support_by_hand_and_back():
    probs = scalar_to_support(torch.tensor([1.25, -2.0, 7.0, -0.5]), support_size=3)
    want = np.zeros((4, 7))
    want[0, 4], want[0, 5] = 0.75, 0.25  # 1.25 between 1 (index 4) and 2 (index 5)
    want[1, 1] = 1.0  # -2 exactly
    want[2, 6] = 1.0  # clipped to 3
    want[3, 2], want[3, 3] = 0.5, 0.5  # -0.5 between -1 and 0
    np.testing.assert_allclose(probs.numpy(), want, atol=1e-7)
    logits = torch.log(probs.clamp(min=1e-12))
    np.testing.assert_allclose(support_to_scalar(logits).numpy(), [1.25, -2.0, 3.0, -0.5],
                               atol=1e-5)  # fmt: skip
    # the cross-entropy of a distribution with itself is its entropy
    ce = support_cross_entropy(logits[:1], probs[:1])
    np.testing.assert_allclose(float(ce), -(0.75 * math.log(0.75) + 0.25 * math.log(0.25)),
                               rtol=1e-5)  # fmt: skip


def test_episode_value_targets_by_hand():
    rewards = torch.tensor([1.0, 2.0, 3.0])
    values = torch.tensor([10.0, 20.0, 30.0])
    g = 0.5
    # n = 2, terminated: z0 = 1 + .5*2 + .25*30; z1 = 2 + .5*3 + 0; z2 = 3 + 0
    got = episode_value_targets(rewards, values, True, 99.0, 2, g)
    np.testing.assert_allclose(got.numpy(), [1 + 1 + 7.5, 2 + 1.5, 3.0])
    # truncated: the final observation's value 8 bootstraps the windows that reach the end
    got = episode_value_targets(rewards, values, False, 8.0, 2, g)
    np.testing.assert_allclose(got.numpy(), [1 + 1 + 7.5, 2 + 1.5 + 0.25 * 8, 3 + 0.5 * 8])


def test_muzero_loss_by_hand():
    """K = 1, one sample: uniform logits over 2 actions and 3 atoms."""
    policy_logits = torch.zeros(2, 1, 2)
    value_logits = torch.zeros(2, 1, 3)
    reward_logits = torch.zeros(1, 1, 3)
    target_policy = torch.tensor([[[1.0, 0.0]], [[0.5, 0.5]]])
    two_hot = torch.tensor([0.0, 1.0, 0.0]).expand(2, 1, 3)
    ones = torch.ones(2, 1, dtype=torch.bool)
    loss, parts = muzero_loss(policy_logits, value_logits, reward_logits,
                                             target_policy, two_hot, two_hot[:1], ones,
                                             torch.tensor([[True], [False]]), ones[:1])  # fmt: skip
    log2, log3 = math.log(2.0), math.log(3.0)
    policy = log2 + log2 / 1  # step 0 full, step 1 scaled by 1/K = 1
    value = log3  # step 1 masked out
    reward = log3
    np.testing.assert_allclose(float(parts["loss/policy"]), policy, rtol=1e-6)
    np.testing.assert_allclose(float(loss), policy + 0.25 * value + reward, rtol=1e-6)


def test_episode_value_targets_of_a_two_player_game():
    """Discount -1 hands each step's value to the other player: moves by players 0, 1, 0,
    the last one winning (+1 for its mover) -> targets +1, -1, +1 from each mover's side."""
    rewards = torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64)
    got = episode_value_targets(rewards, torch.zeros(3, dtype=torch.float64), True, 0.0, 10, -1.0)
    np.testing.assert_allclose(got.numpy(), [1.0, -1.0, 1.0])
