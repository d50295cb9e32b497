"""The batches that the on-policy learners (PPO, A2C, TRPO) train on, built from a `Rollout`.

Advantages and returns are GAE over the time-major rollout (`shoal.losses.gae`; lambda 1 gives
n-step returns bootstrapped at the rollout's end). Feed-forward learners take the valid
transitions flattened into one batch; recurrent learners take pieces of the env sequences so
that the recurrent state can be replayed through them.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from shoal.data.rollout import episode_starts, to_chunks
from shoal.losses import gae
from shoal.types import Rollout


class PPOBatch(NamedTuple):
    """Flat ``[N, ...]`` training samples: the valid transitions of a rollout."""

    obs: torch.Tensor
    actions: torch.Tensor
    log_probs: torch.Tensor
    values: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor


class PPOSequenceBatch(NamedTuple):
    """Training data of a recurrent model: ``chunks`` holds ``[chunk, N, ...]`` pieces of the
    env sequences (`shoal.data.rollout.to_chunks`), with their ``valid`` and episode
    ``starts`` flags; the rest recomputes the state at each piece's start."""

    chunks: PPOBatch
    valid: torch.Tensor
    starts: torch.Tensor
    rollout_obs: torch.Tensor
    rollout_starts: torch.Tensor
    initial_state: torch.Tensor


def _gae(rollout: Rollout, gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    return gae(
        rollout.rewards,
        rollout.values,
        rollout.next_values,
        rollout.terminated,
        rollout.truncated,
        gamma,
        lam,
    )


def make_sequence_batch(rollout: Rollout, gamma: float, lam: float, chunk: int) -> PPOSequenceBatch:
    """GAE over the rollout, then pieces of ``chunk`` steps per env (autoreset steps stay in
    place, flagged invalid, so that the sequences keep their timing)."""
    advantages, returns = _gae(rollout, gamma, lam)
    starts = episode_starts(rollout.valid)
    fields = (rollout.obs, rollout.actions, rollout.log_probs, rollout.values, advantages, returns)
    return PPOSequenceBatch(
        PPOBatch(*(to_chunks(x, chunk) for x in fields)),
        to_chunks(rollout.valid, chunk),
        to_chunks(starts, chunk),
        rollout.obs,
        starts,
        rollout.policy_state,
    )


def make_batch(rollout: Rollout, gamma: float, lam: float) -> PPOBatch:
    """GAE over the time-major rollout, then keep only the real (non-autoreset) transitions."""
    advantages, returns = _gae(rollout, gamma, lam)
    keep = rollout.valid.flatten()
    flat = lambda x: x.flatten(0, 1)[keep]
    return PPOBatch(
        flat(rollout.obs),
        flat(rollout.actions),
        flat(rollout.log_probs),
        flat(rollout.values),
        flat(advantages),
        flat(returns),
    )
