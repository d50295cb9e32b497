"""The batches the on-policy learners (PPO, A2C, TRPO, ACKTR, APPO, DD-PPO) train on, built
from a `Rollout`.

Advantages and returns are GAE over the time-major rollout (`shoal.losses.gae`; lambda 1 gives
n-step returns bootstrapped at the rollout's end). Feed-forward learners take the valid
transitions flattened into one batch; recurrent learners take pieces of the env sequences so
that the recurrent state can be replayed through them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch

from shoal.core.types import Rollout
from shoal.data.rollout import episode_starts, to_chunks
from shoal.losses import gae


class RolloutBatch(NamedTuple):
    """Flat ``[N, ...]`` training samples: the valid transitions of a rollout with their
    advantages and returns, what PPO, A2C, TRPO, ACKTR, APPO and DD-PPO learn from (it was
    ``PPOBatch``)."""

    obs: torch.Tensor
    actions: torch.Tensor
    log_probs: torch.Tensor
    values: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    action_mask: torch.Tensor | None = None
    """``[N, A]`` legal actions at each observation, where the env reports them."""

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> RolloutBatch:
        """``fn`` applied to every field (the mask too, when there is one)."""
        return RolloutBatch(*(None if x is None else fn(x) for x in self))  # type: ignore[arg-type]


class RolloutSequenceBatch(NamedTuple):
    """Training data of a recurrent model: ``chunks`` holds ``[chunk, N, ...]`` pieces of the
    env sequences (`shoal.data.rollout.to_chunks`), with their ``valid`` and episode
    ``starts`` flags; the rest recomputes the state at each piece's start."""

    chunks: RolloutBatch
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


def make_sequence_batch(
    rollout: Rollout, gamma: float, lam: float, chunk: int
) -> RolloutSequenceBatch:
    """GAE over the rollout, then pieces of ``chunk`` steps per env (autoreset steps stay in
    place, flagged invalid, so that the sequences keep their timing)."""
    advantages, returns = _gae(rollout, gamma, lam)
    starts = episode_starts(rollout.valid)
    fields = (rollout.obs, rollout.actions, rollout.log_probs, rollout.values, advantages, returns)
    return RolloutSequenceBatch(
        RolloutBatch(*(to_chunks(x, chunk) for x in fields)),
        to_chunks(rollout.valid, chunk),
        to_chunks(starts, chunk),
        rollout.obs,
        starts,
        rollout.policy_state,
    )


def make_batch(rollout: Rollout, gamma: float, lam: float) -> RolloutBatch:
    """GAE over the time-major rollout, then keep only the real (non-autoreset) transitions,
    flat. Rollouts live on the CPU, so this runs on NumPy views of their memory: a dozen
    NumPy calls cost a fraction of the same tensor ops' dispatch on rollouts this small."""
    values = rollout.values.numpy()
    next_values = np.concatenate([values[1:], rollout.last_values.numpy()[None]])
    advantages, returns = gae(
        rollout.rewards.numpy(),
        values,
        next_values,
        rollout.terminated.numpy(),
        rollout.truncated.numpy(),
        gamma,
        lam,
    )
    keep = rollout.valid.numpy().reshape(-1)

    def flat(x: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(x.reshape(keep.size, *x.shape[2:])[keep])

    return RolloutBatch(
        flat(rollout.obs.numpy()),
        flat(rollout.actions.numpy()),
        flat(rollout.log_probs.numpy()),
        flat(values),
        flat(advantages),
        flat(returns),
        None if rollout.action_mask is None else flat(rollout.action_mask.numpy()),
    )
