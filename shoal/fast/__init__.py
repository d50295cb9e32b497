"""The fast path: small MLP actor-critics trained and run in NumPy instead of through autograd.

On the networks of control tasks a PyTorch step is mostly per-operation overhead; this package
does the same arithmetic as a few dozen NumPy calls (`shoal.fast.mlp`). It has two entry
points, and nothing outside it but the backend chooser (`shoal.fast.backend`) knows it exists:

* `NumpyLearner.step`: the learner side. It takes an objective
  (`shoal.losses.objectives.Objective`) and a batch, and applies one gradient step through
  `shoal.optim.minimize`, with the objective's gradients carried through the network by hand.
* `NumpyActor`: the runner side. It acts on observation arrays with the sampler's weight copy.

Both compute what the torch path computes, to float32 rounding (``tests/fast/``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from shoal.core.types import ActOutput
from shoal.fast.mlp import NumpyActorCritic, unsupported
from shoal.fast.ops import as_array
from shoal.losses.objectives import Objective, PolicyOutputs
from shoal.optim import minimize

__all__ = ["NumpyActor", "NumpyLearner", "unsupported"]


class NumpyLearner:
    """One gradient step of an objective on a batch, for a learner's ``model``, whose
    parameters move into one flat buffer (they stay the same `Parameter` objects, so an
    optimizer built on them before or after keeps working). Also the `GradientBackend`
    `shoal.optim.minimize` calls back into."""

    def __init__(self, model: torch.nn.Module):
        self.net = NumpyActorCritic(model, flat_parameters=True)
        self._pending: tuple[tuple, PolicyOutputs] | None = None

    def step(
        self,
        objective: Objective,
        batch: Any,
        optimizer: torch.optim.Optimizer,
        max_grad_norm: float | None,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """``batch``: a `shoal.algos.cores.rollout_batch.RolloutBatch` (tensors or arrays).
        Returns the objective's losses and diagnostics (NumPy scalars)."""
        batch = type(batch)(*(None if x is None else as_array(x) for x in batch))
        out, saved = self.net.outputs(batch.obs, batch.actions)
        targets = objective.targets(batch)
        losses, stats = objective.losses(out, targets)
        self._pending = (saved, objective.gradients(out, targets))
        try:
            minimize(losses, optimizer, max_grad_norm, backend=self)
        finally:
            self._pending = None
        return losses, stats

    def backward(self) -> None:
        assert self._pending is not None, "backward() runs inside step()"
        saved, grads = self._pending
        self.net.backward(saved, grads)

    def clip(self, max_grad_norm: float) -> float:
        return self.net.clip(max_grad_norm)

    def apply(self, optimizer: torch.optim.Optimizer) -> None:
        self.net.step(optimizer)


class NumpyActor:
    """``model.act`` and ``model.value`` on observation arrays, results as arrays, for a
    sampler's weight copy (the same actions from the same random draws)."""

    def __init__(self, model: torch.nn.Module):
        self.net = NumpyActorCritic(model)

    def act(self, obs: np.ndarray, deterministic: bool = False) -> ActOutput:
        return self.net.act(obs, deterministic)

    def value(self, obs: np.ndarray) -> np.ndarray:
        return self.net.value(obs)
