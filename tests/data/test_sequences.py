"""R2D2's sequence cutting (`shoal.data.sequences.SequenceBuilder`) on synthetic streams whose
observations name their episode and step: the stored state is the one before the sequence's
first step, sequences never cross an episode end, the episode start is padded and flagged,
every step is learned, and the builder's state resumes exactly."""

import numpy as np
import pytest
import torch

from shoal.core.types import Rollout
from shoal.data.sequences import SequenceBuilder


def _streams(lengths_per_env, truncate_every=0):
    """Per env, the autoreset stream of its episodes: (obs, state, reward, term, trunc, valid).
    Observation = 1000 * episode + step (the final observation has step = length); the state
    before a step is -(obs) so it is told apart from the observation."""
    streams = []
    for lengths in lengths_per_env:
        rows = []
        for e, length in enumerate(lengths):
            truncated = truncate_every and (e + 1) % truncate_every == 0
            for s in range(length):
                last = s == length - 1
                rows.append((1000 * e + s, -(1000 * e + s), 1.0, last and not truncated,
                             last and bool(truncated), True))  # fmt: skip
            rows.append((1000 * e + length, 0.0, 0.0, False, False, False))  # autoreset step
        streams.append(rows)
    return streams


def _rollouts(streams, steps):
    """Cut the streams into rollouts of ``steps`` (while every stream has a next element)."""
    total = min(len(s) for s in streams) - 1
    for begin in range(0, total - steps + 1, steps):
        rows = [[s[begin + t] for s in streams] for t in range(steps)]

        def field(i, dtype, rows=rows):
            return torch.tensor([[r[i] for r in row] for row in rows], dtype=dtype)

        obs = field(0, torch.float32).unsqueeze(-1)
        states = field(1, torch.float32).view(steps, len(streams), 1, 1).expand(-1, -1, 2, 3)
        yield Rollout(
            obs=obs, actions=field(0, torch.int64) % 7, log_probs=torch.zeros(steps, len(streams)),
            values=torch.zeros(steps, len(streams)), rewards=field(2, torch.float32),
            terminated=field(3, torch.bool), truncated=field(4, torch.bool),
            valid=field(5, torch.bool), last_values=torch.zeros(len(streams)),
            last_obs=torch.tensor([[s[begin + steps][0]] for s in streams], dtype=torch.float32),
            step_states=states.contiguous(),
        )  # fmt: skip


def _collect(builder, streams, steps=5):
    out = []
    for rollout in _rollouts(streams, steps):
        out += builder.add(rollout)
    return out


@pytest.mark.parametrize(("burn_in", "length", "period"), [(2, 4, 4), (3, 4, 2), (0, 3, 3)])
def test_sequences_follow_their_episode(burn_in, length, period):
    streams = _streams([[7, 3, 11, 2], [1, 13, 5, 4]], truncate_every=2)
    builder = SequenceBuilder(2, burn_in, length, period)
    sequences = _collect(builder, streams)
    assert sequences
    learned = {}
    for seq in sequences:
        n = burn_in + length
        obs, valid, starts = seq["obs"][:, 0], seq["valid"], seq["starts"]
        assert obs.shape == starts.shape == (n + 1,) and valid.shape == (n,)
        real = np.flatnonzero(valid)
        episode = int(obs[real[0]]) // 1000
        steps = obs[real].astype(int) - 1000 * episode
        # One episode, consecutive steps, no gap: never across an episode's end.
        assert (np.diff(steps) == 1).all() and (obs[real] // 1000 == episode).all()
        first_step = steps[0] - real[0]  # the episode step at position 0 (negative: padding)
        assert first_step >= -burn_in and (first_step + burn_in) % period == 0
        if first_step < 0:
            assert not valid[:-first_step].any() and starts[-first_step]
            assert (seq["state"] == 0).all()  # begins on padding: a zero state
        else:
            # The actor's state before the first step, not the one after it.
            assert (seq["state"] == -(1000 * episode + first_step)).all()
        assert starts.sum() == (1 if first_step <= 0 else 0)
        # After the last transition: the next observation is real (the final one at an end).
        after = real[-1] + 1
        assert obs[after] == 1000 * episode + steps[-1] + 1
        assert not valid[after:].any() and (obs[after + 1 :] == 0).all()
        for p in real[real >= burn_in]:
            learned[(episode, int(obs[p]))] = learned.get((episode, int(obs[p])), 0) + 1
    # Every transition of env 0's episodes that end within the rollouts (the first three) is
    # learned (once without overlap).
    for e, episode_length in enumerate([7, 3, 11]):
        for s in range(episode_length):
            count = learned.get((e, 1000 * e + s), 0)
            assert count >= 1, (e, s)
            if period == length:
                assert count <= 2  # env 1 may hold the same (episode, step) marker


def test_a_termination_is_not_bootstrapped_past():
    streams = _streams([[3, 4]])
    sequences = _collect(SequenceBuilder(1, 0, 4, 4), streams, steps=3)
    seq = sequences[0]
    assert seq["terminated"].tolist() == [False, False, True, False]
    assert seq["valid"].tolist() == [True, True, True, False]
    assert seq["obs"][:, 0].tolist() == [0.0, 1.0, 2.0, 3.0, 0.0]


def test_builder_state_resumes_exactly():
    streams = _streams([[9, 6, 12], [4, 15, 3]])
    rollouts = list(_rollouts(streams, 4))
    straight = SequenceBuilder(2, 2, 4, 2)
    want = [s for r in rollouts for s in straight.add(r)]
    first = SequenceBuilder(2, 2, 4, 2)
    got = [s for r in rollouts[:3] for s in first.add(r)]
    resumed = SequenceBuilder(2, 2, 4, 2)
    resumed.load_state_dict(first.state_dict())
    got += [s for r in rollouts[3:] for s in resumed.add(r)]
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_bad_settings():
    with pytest.raises(ValueError, match="period"):
        SequenceBuilder(1, 2, 4, 5)


def test_reused_rollout_buffers_do_not_leak_into_stored_steps():
    # Samplers write every rollout into the same buffers: the builder must copy what it keeps.
    streams = _streams([[9, 6, 12], [4, 15, 3]])
    fresh = list(_rollouts(streams, 4))
    reference = SequenceBuilder(2, 2, 4, 2)
    want = [s for r in fresh for s in reference.add(r)]
    shared = {name: getattr(fresh[0], name).clone() for name in ("obs", "step_states")}
    builder, got = SequenceBuilder(2, 2, 4, 2), []
    for rollout in fresh:
        for name, buffer in shared.items():
            buffer.copy_(getattr(rollout, name))
        got += builder.add(rollout._replace(**shared))
    assert len(got) == len(want) > 5
    assert all(np.array_equal(a[k], b[k]) for a, b in zip(got, want, strict=True) for k in a)
