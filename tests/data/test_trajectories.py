"""MuZero's replay of episodes: unroll targets by hand across episode ends (terminated and
truncated), the ring's overwriting, priorities, and its state."""

import numpy as np
import torch

from shoal.data.trajectories import Episode, TrajectoryReplay


def episode(length, first, terminated, actions=2):
    steps = np.arange(length, dtype=np.float32)
    policies = np.tile(np.eye(actions, dtype=np.float32)[0], (length, 1))
    return Episode(
        obs=(first + steps)[:, None],
        actions=(np.arange(length) % actions),
        rewards=first + steps,
        root_values=np.zeros(length, np.float32),
        policies=policies,
        value_targets=10 * (first + steps),
        terminated=terminated,
    )


def test_unroll_targets_by_hand():
    replay = TrajectoryReplay(10, (1,), 2, alpha=0.0)
    replay.add(episode(3, 0.0, terminated=True))  # rows 0-2, rewards 0 1 2
    replay.add(episode(2, 100.0, terminated=False))  # rows 3-4, truncated
    batch = replay.unroll(np.array([1, 3]), 3, np.ones(2, np.float32))
    # from row 1 (terminated episode): steps 1, 2 inside, then 0 values/rewards, no policy
    assert batch.obs[:, 0].tolist() == [1.0, 100.0]
    np.testing.assert_array_equal(batch.target_value[:, 0], [10, 20, 0, 0])
    np.testing.assert_array_equal(batch.value_mask[:, 0], [True, True, True, True])
    np.testing.assert_array_equal(batch.target_reward[:, 0], [1, 2, 0])
    np.testing.assert_array_equal(batch.reward_mask[:, 0], [True, True, True])
    np.testing.assert_array_equal(batch.policy_mask[:, 0], [True, True, False, False])
    assert batch.actions[:2, 0].tolist() == [1, 0]  # the actions played at steps 1 and 2
    # from row 3 (truncated episode of 2 steps): nothing is known past its end
    np.testing.assert_array_equal(batch.target_value[:2, 1], [1000, 1010])
    np.testing.assert_array_equal(batch.value_mask[:, 1], [True, True, False, False])
    np.testing.assert_array_equal(batch.reward_mask[:, 1], [True, True, False])
    np.testing.assert_array_equal(batch.target_reward[:2, 1], [100, 101])
    np.testing.assert_array_equal(batch.policy_mask[:, 1], [True, True, False, False])
    torch.testing.assert_close(batch.target_policy[0, 0], torch.tensor([1.0, 0.0]))
    torch.testing.assert_close(batch.target_policy[3, 0], torch.tensor([0.5, 0.5]))


def test_the_ring_overwrites_the_oldest_positions_and_keeps_later_unrolls_whole():
    replay = TrajectoryReplay(5, (1,), 2, alpha=0.0)
    replay.add(episode(3, 0.0, terminated=True))  # rows 0-2
    replay.add(episode(4, 50.0, terminated=True))  # rows 3, 4, 0, 1: rows 0-1 overwritten
    assert len(replay) == 5 and replay.written == 7
    assert replay.priorities.num_active == 5
    batch = replay.unroll(np.array([2, 3]), 2, np.ones(2, np.float32))
    # row 2 is the old episode's last step: its unroll ends there
    np.testing.assert_array_equal(batch.target_value[:, 0], [20, 0, 0])
    # row 3 starts the new episode, which wraps round the ring: rows 3, 4, 0
    np.testing.assert_array_equal(batch.target_value[:, 1], [500, 510, 520])
    np.testing.assert_array_equal(batch.target_reward[:, 1], [50, 51])
    draws = replay.sample(256, 2).indices
    assert set(draws.tolist()) == {0, 1, 2, 3, 4}


def test_priorities_follow_the_value_errors_and_the_state_round_trips():
    replay = TrajectoryReplay(8, (1,), 2, alpha=1.0, seed=3)
    ep = episode(4, 0.0, terminated=True)
    replay.add(ep._replace(root_values=np.array([0.0, 0.0, 0.0, 30.0], np.float32)))
    # errors |root value - target| = 0, 10, 20, 0 (+ eps): row 2 twice as likely as row 1
    draws = replay.sample(3000, 1).indices
    counts = np.bincount(draws, minlength=4)
    assert counts[0] < 10 and counts[3] < 10 and 1.5 < counts[2] / counts[1] < 2.5
    replay.update_priorities(np.array([1]), np.array([100.0]))
    copy = TrajectoryReplay(8, (1,), 2, alpha=1.0)
    copy.load_state_dict(replay.state_dict())
    a, b = replay.sample(16, 2), copy.sample(16, 2)
    assert np.array_equal(a.indices, b.indices)
    torch.testing.assert_close(a.target_value, b.target_value)
