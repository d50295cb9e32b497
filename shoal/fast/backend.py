"""Where and how networks run: the one place that chooses a backend, moves networks to the
run's device and compiles them.

``model.backend`` picks how a small actor-critic trains and acts: ``torch`` (autograd, any
device), ``numpy`` (the fast path of small MLP actor-critics on the CPU, `shoal.fast`), or
``auto``: numpy where the model, the device and the run allow it, torch otherwise. Learners
take their gradient steps through `learner_step` and samplers act through `actor`; neither
knows which implementation it got. Networks go to ``run.device`` and, with ``run.compile``,
through ``torch.compile`` in `place`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import torch
from torch import nn

from shoal import fast
from shoal.core.errors import ConfigError
from shoal.core.types import ActOutput
from shoal.losses.objectives import Objective, PolicyOutputs
from shoal.nn.target import eager_copy
from shoal.optim import minimize

LearnerStep = Callable[..., tuple[dict[str, Any], dict[str, Any]]]
"""``step(objective, batch, optimizer, max_grad_norm, outputs=None) -> (losses, stats)``."""


def uses_numpy(
    model: nn.Module, backend: str, device: torch.device | str = "cpu", compiled: bool = False
) -> bool:
    """Whether ``model`` runs on the NumPy path: ``backend`` numpy or auto, and nothing in the
    way. ``backend`` numpy with something in the way is a `ConfigError` saying what."""
    if backend == "torch":
        return False
    reason: str | None
    if torch.device(device).type != "cpu":
        reason = f"run.device is {device} (the NumPy path computes on the CPU)"
    elif compiled:
        reason = "run.compile compiles the torch path"
    else:
        reason = fast.unsupported(model)
    if reason is not None and backend == "numpy":
        raise ConfigError(
            f"model.backend = 'numpy' is not available for this model: {reason}; use auto or torch"
        )
    return reason is None


Module = TypeVar("Module", bound=nn.Module)


def place(module: Module, device: torch.device, compiled: bool = False) -> Module:
    """``module`` moved to ``device`` and, with ``compiled``, compiled in place
    (``nn.Module.compile``: forward and, through AOTAutograd, backward; the module keeps its
    parameters and state-dict keys)."""
    module.to(device)
    if compiled:
        module.compile()
    return module


def uncompiled_copy(module: Module, device: torch.device | str = "cpu") -> Module:
    """An eager copy of ``module`` (`shoal.nn.target.eager_copy`) on ``device`` (a deployed
    policy's or an acting copy's: the CPU)."""
    return eager_copy(module).to(device)


def evaluate_objective(
    model: nn.Module, objective: Objective, batch: Any, outputs: tuple | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The objective's loss terms and diagnostics on ``batch`` through autograd (a graph to
    differentiate, no step). ``outputs``: the model's ``(distribution, values)`` of ``batch``
    when the caller ran the model itself (recurrent models replay sequences)."""
    if outputs is not None:
        dist, values = outputs
    elif getattr(batch, "action_mask", None) is not None:
        dist, values = model(batch.obs, batch.action_mask)  # the policy the sampler acted with
    else:
        dist, values = model(batch.obs)
    out = PolicyOutputs(dist.log_prob(batch.actions), dist.entropy(), values)
    return objective.losses(out, objective.targets(batch))


class TorchStep:
    """One gradient step of an objective through autograd (`shoal.optim.minimize`).

    ``before_minimize(losses)`` runs before the step (DD-PPO's ranks agree there that every
    loss is finite) and ``before_clip()`` between the backward pass and clipping (DD-PPO's
    gradient all-reduce)."""

    def __init__(
        self,
        model: nn.Module,
        scaler: torch.amp.GradScaler | None = None,
        *,
        before_minimize: Callable[[dict[str, Any]], None] | None = None,
        before_clip: Callable[[], None] | None = None,
    ):
        self.model = model
        self.scaler = scaler
        self.before_minimize = before_minimize
        self.before_clip = before_clip

    def __call__(
        self,
        objective: Objective,
        batch: Any,
        optimizer: torch.optim.Optimizer,
        max_grad_norm: float | None,
        outputs: tuple | None = None,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """See `evaluate_objective` for ``outputs``."""
        losses, stats = evaluate_objective(self.model, objective, batch, outputs)
        if self.before_minimize is not None:
            self.before_minimize(losses)
        minimize(losses, optimizer, max_grad_norm, scaler=self.scaler, before_clip=self.before_clip)
        return losses, stats


class NumpyStep:
    """`TorchStep` through the NumPy path (no ``outputs``: it runs the model itself)."""

    def __init__(self, model: nn.Module):
        self.learner = fast.NumpyLearner(model)

    def __call__(
        self,
        objective: Objective,
        batch: Any,
        optimizer: torch.optim.Optimizer,
        max_grad_norm: float | None,
        outputs: tuple | None = None,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        if outputs is not None:
            raise ValueError("the NumPy path computes its own outputs")
        return self.learner.step(objective, batch, optimizer, max_grad_norm)


def learner_step(
    model: nn.Module,
    backend: str,
    device: torch.device,
    compiled: bool = False,
    scaler: torch.amp.GradScaler | None = None,
) -> TorchStep | NumpyStep:
    """The gradient step of an on-policy actor-critic learner (`TorchStep` or `NumpyStep`).
    Choosing the NumPy path moves the model's parameters into one flat buffer."""
    if uses_numpy(model, backend, device, compiled):
        return NumpyStep(model)
    return TorchStep(model, scaler)


class TorchActor:
    """A sampler's acting network on observation arrays (tensors out)."""

    def __init__(self, model: Any):
        self.model = model

    def act(self, obs: np.ndarray, deterministic: bool = False) -> ActOutput:
        return self.model.act(torch.from_numpy(obs), deterministic)

    def value(self, obs: np.ndarray) -> torch.Tensor:
        return self.model.value(torch.as_tensor(obs))


def actor(model: Any, backend: str = "auto") -> TorchActor | fast.NumpyActor:
    """How a sampler's weight copy (on the CPU) acts: through NumPy where it can."""
    if isinstance(model, nn.Module) and uses_numpy(model, backend):
        return fast.NumpyActor(model)
    return TorchActor(model)
