"""R2D2's in-sequence n-step targets and sequence priorities, by hand and against a naive loop;
the value rescaling and its inverse."""

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from shoal.losses.sequence_q import sequence_n_step_targets, sequence_priorities
from shoal.losses.value import inverse_value_transform, value_transform

F, T = False, True


def _naive(rewards, terminated, valid, bootstrap, gamma, n):
    length, cols = rewards.shape
    out = np.zeros((length, cols))
    for b in range(cols):
        for t in range(length):
            if not valid[t, b]:
                continue
            total, discount, k, ended = 0.0, 1.0, 0, False
            while k < n and t + k < length and valid[t + k, b]:
                total += discount * float(rewards[t + k, b])
                discount *= gamma
                k += 1
                if terminated[t + k - 1, b]:
                    ended = True
                    break
            out[t, b] = total + (0.0 if ended else discount * float(bootstrap[t + k, b]))
    return torch.tensor(out, dtype=torch.float64)


def test_hand_computed():
    # One sequence of 4 transitions, n = 2, gamma 0.5; bootstrap values 10, 20, 30, 40, 50.
    rewards = torch.tensor([[1.0], [2.0], [3.0], [4.0]])
    flags = torch.zeros(4, 1, dtype=torch.bool)
    bootstrap = torch.tensor([[10.0], [20.0], [30.0], [40.0], [50.0]])
    out = sequence_n_step_targets(rewards, flags, ~flags, bootstrap, gamma=0.5, n=2)
    # t0: 1 + 0.5 * 2 + 0.25 * 30 = 9.5; t1: 2 + 1.5 + 0.25 * 40 = 13.5;
    # t2: 3 + 2 + 0.25 * 50 = 17.5; t3: the sequence ends: 4 + 0.5 * 50 = 29.
    assert_close(out, torch.tensor([[9.5], [13.5], [17.5], [29.0]]))


def test_termination_and_episode_end():
    rewards = torch.tensor([[1.0], [2.0], [0.0], [0.0]])
    terminated = torch.tensor([[F], [T], [F], [F]])
    valid = torch.tensor([[T], [T], [F], [F]])  # the episode ends at t = 1, then padding
    bootstrap = torch.tensor([[10.0], [20.0], [30.0], [40.0], [50.0]])
    out = sequence_n_step_targets(rewards, terminated, valid, bootstrap, gamma=0.5, n=3)
    assert_close(out[:2], torch.tensor([[2.0], [2.0]]))  # no bootstrap after a termination
    # A time-limit truncation instead: bootstrap from the final observation (position 2).
    out = sequence_n_step_targets(rewards, torch.zeros_like(terminated), valid, bootstrap, 0.5, 3)
    assert_close(out[:2], torch.tensor([[1.0 + 1.0 + 0.25 * 30.0], [2.0 + 0.5 * 30.0]]))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("n", [1, 3, 5])
def test_matches_naive_loop(seed, n):
    g = torch.Generator().manual_seed(seed)
    length, cols = 9, 5
    rewards = torch.randn(length, cols, generator=g, dtype=torch.float64)
    bootstrap = torch.randn(length + 1, cols, generator=g, dtype=torch.float64)
    terminated = torch.rand(length, cols, generator=g) < 0.1
    # Valid: a contiguous run per column (padding before the episode's start and after its end).
    valid = torch.zeros(length, cols, dtype=torch.bool)
    for b in range(cols):
        start = int(torch.randint(0, 3, (1,), generator=g))
        end = int(torch.randint(start + 1, length + 1, (1,), generator=g))
        valid[start:end, b] = True
    terminated &= valid
    out = sequence_n_step_targets(rewards, terminated, valid, bootstrap, 0.9, n)
    want = _naive(rewards, terminated, valid, bootstrap, 0.9, n)
    assert_close(torch.where(valid, out, 0.0), want)


def test_shape_checks():
    with pytest.raises(ValueError, match="L \\+ 1"):
        sequence_n_step_targets(torch.zeros(3, 1), torch.zeros(3, 1), torch.ones(3, 1),
                                torch.zeros(3, 1), 0.9, 2)  # fmt: skip


def test_priorities_by_hand():
    td = torch.tensor([[1.0, 5.0], [3.0, 0.0], [2.0, 9.0]])
    mask = torch.tensor([[T, F], [T, F], [F, F]])
    # Column 0: max 3, mean 2 over its two learned steps -> 0.9 * 3 + 0.1 * 2 = 2.9; column 1
    # has no learned step -> 0 (its large errors are burn-in or padding).
    assert_close(sequence_priorities(td, mask, eta=0.9), torch.tensor([2.9, 0.0]))


def test_value_rescaling_round_trip():
    x = torch.tensor([-1000.0, -3.5, -1e-3, 0.0, 0.5, 7.0, 12345.0], dtype=torch.float64)
    assert_close(inverse_value_transform(value_transform(x)), x)
    assert_close(value_transform(inverse_value_transform(x)), x)
