"""The one optimizer every learner builds (`build_optimizer`) and the one optimizer step every
learner takes (`minimize`).

``build_optimizer(params, kind, lr, eps, ...)`` is Adam (L2 weight decay added to the
gradient), AdamW (decoupled weight decay), RMSprop or RMSprop in TensorFlow's form
(`RMSpropTF`), each with the implementation that updates all parameters in a few kernels: Adam
and AdamW fused, both RMSprops through the multi-tensor ("foreach") path. PyTorch's CPU default
loops over the parameters one tensor at a time, which costs more than the arithmetic on the
small networks of control tasks.

The two RMSprops differ where A2C on Atari feels it. PyTorch's divides by ``sqrt(v) + eps``
with the squared-gradient average ``v`` starting at 0, so its first steps are about
``lr / sqrt(1 - alpha)`` = 10 lr per parameter whatever the gradient's size (sign-like): a
policy head reading thousands of features moves its logits by several units per step and the
policy collapses within a few updates. ``rmsprop-tf`` is the rule as Mnih et al. 2016
("Asynchronous Methods for Deep Reinforcement Learning") write it and as TensorFlow, OpenAI
Baselines and the rl-baselines3-zoo Atari settings (SB3's ``RMSpropTFLike``) run it: ``v``
starts at 1 and the step divides by ``sqrt(v + eps)``.

``minimize(losses, optimizer, max_grad_norm)`` checks that the losses are finite (a
`NaNLossError` names the term that is not, before anything changes), zeroes the gradients,
backpropagates ``losses["total"]`` (scaled for float16 training), lets a caller combine the
gradients (DD-PPO averages them over its ranks), clips their global norm and steps the
optimizer. It is also the one place a gradient backend plugs in: by default autograd and the
optimizer; the NumPy path of small actor-critics (`shoal.fast`) brings its own backward pass,
clipping and step through the same function (`GradientBackend`), so both paths refuse the same
losses with the same messages.

`optimizer_step` is ``optimizer.step()`` for Adam, AdamW and RMSprop through PyTorch's
functional optimizer API. ``Optimizer.step`` wraps the arithmetic in hook dispatch, a profiler
record, grad-mode switching and a scan of every parameter's state; on a small network that
costs more than the update itself (measured on a 64x64 actor-critic: 46 us for the wrapper
against 29 us through the functional API, one thread). The functional API
(``torch.optim.adam.adam``, ``torch.optim.rmsprop.rmsprop``) is the same code ``step`` calls,
with the optimizer's own state tensors and hyperparameters; anything it does not cover goes
through ``optimizer.step()``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

import torch
from torch import Tensor
from torch.optim.adam import adam
from torch.optim.rmsprop import rmsprop

from shoal.core.errors import NaNLossError

Loss = Tensor | float

OPTIMIZERS = ("adam", "adamw", "rmsprop", "rmsprop-tf")


def build_optimizer(
    params: Iterable[Tensor] | Sequence[dict[str, Any]],
    kind: str,
    lr: float,
    eps: float,
    weight_decay: float = 0.0,
    alpha: float = 0.99,
    momentum: float = 0.0,
) -> torch.optim.Optimizer:
    """An optimizer over ``params`` (tensors, or parameter groups with their own settings):
    ``kind`` adam, adamw, rmsprop or rmsprop-tf (``alpha``: RMSprop's squared-gradient
    smoothing, ``momentum`` its momentum); see the module docstring."""
    if kind == "rmsprop-tf":
        return RMSpropTF(params, lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay,
                         momentum=momentum)  # fmt: skip
    if kind == "rmsprop":
        return torch.optim.RMSprop(
            params, lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay, momentum=momentum,
            foreach=True,
        )  # fmt: skip
    if kind not in ("adam", "adamw"):
        raise ValueError(f"optimizer kind must be one of {OPTIMIZERS}, not {kind!r}")
    cls = torch.optim.AdamW if kind == "adamw" else torch.optim.Adam
    return cls(params, lr=lr, eps=eps, weight_decay=weight_decay, fused=True)


class RMSpropTF(torch.optim.Optimizer):
    """RMSprop in TensorFlow's form (see the module docstring), per parameter:

        g <- grad + weight_decay * p
        v <- alpha * v + (1 - alpha) * g**2          (v starts at 1, not 0)
        b <- momentum * b + g / sqrt(v + eps)        (b starts at 0; b = the step without momentum)
        p <- p - lr * b

    Every parameter of a group is updated in a few multi-tensor ("foreach") ops."""

    def __init__(
        self,
        params: Iterable[Tensor] | Sequence[dict[str, Any]],
        lr: float = 1e-2,
        alpha: float = 0.99,
        eps: float = 1e-10,
        weight_decay: float = 0.0,
        momentum: float = 0.0,
    ) -> None:
        if not (lr > 0 and 0 <= alpha < 1 and eps >= 0 and weight_decay >= 0 and momentum >= 0):
            raise ValueError(
                f"RMSpropTF needs lr > 0, 0 <= alpha < 1 and eps, weight_decay, momentum >= 0; "
                f"got lr={lr}, alpha={alpha}, eps={eps}, weight_decay={weight_decay}, "
                f"momentum={momentum}"
            )
        defaults = dict(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay, momentum=momentum)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(  # type: ignore[override]  # (torch states this signature as two overloads)
        self, closure: Callable[[], float] | None = None
    ) -> float | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            grads: Any = [p.grad for p in params if p.grad is not None]
            if group["weight_decay"]:
                grads = torch._foreach_add(grads, params, alpha=group["weight_decay"])
            squares, buffers = [], []
            for p in params:
                state = self.state[p]
                if not state:
                    state["square_avg"] = torch.ones_like(p, memory_format=torch.preserve_format)
                    if group["momentum"]:
                        state["momentum_buffer"] = torch.zeros_like(p)
                squares.append(state["square_avg"])
                buffers.append(state.get("momentum_buffer"))
            alpha = group["alpha"]
            torch._foreach_mul_(squares, alpha)
            torch._foreach_addcmul_(squares, grads, grads, value=1 - alpha)
            denom = torch._foreach_add(squares, group["eps"])
            torch._foreach_sqrt_(denom)
            if group["momentum"]:
                torch._foreach_mul_(buffers, group["momentum"])
                torch._foreach_addcdiv_(buffers, grads, denom)
                torch._foreach_add_(params, buffers, alpha=-group["lr"])
            else:
                torch._foreach_addcdiv_(params, grads, denom, value=-group["lr"])
        return loss


class GradientBackend(Protocol):
    """How `minimize` gets and applies gradients when autograd does not (`shoal.fast`)."""

    def backward(self) -> None:
        """Write the gradient of the total loss into the parameters' ``.grad``."""
        ...

    def clip(self, max_grad_norm: float) -> float:
        """Scale the gradients down to ``max_grad_norm``; returns their norm before."""
        ...

    def apply(self, optimizer: torch.optim.Optimizer) -> None:
        """Take the optimizer's step with the (clipped) gradients."""
        ...


def is_finite(value: Loss) -> bool:
    if isinstance(value, Tensor):
        return bool(torch.isfinite(value).all())
    return math.isfinite(value)


def total_loss(losses: Mapping[str, Loss]) -> Loss:
    """``losses["total"]``, or the only term of a one-term dict."""
    if "total" in losses:
        return losses["total"]
    if len(losses) != 1:
        raise ValueError(f"losses need a 'total' entry or a single term, got {list(losses)}")
    return next(iter(losses.values()))


def check_finite(losses: Mapping[str, Loss], weights: str = "weights left unchanged") -> None:
    """Raise `NaNLossError` naming the first non-finite term unless the total loss
    (`total_loss`) is finite (the terms are tensors or Python floats). Nothing is saved after
    it, so the last checkpoint stays good; ``weights`` says what became of the weights in
    memory."""
    if not is_finite(total_loss(losses)):
        bad = next((k for k, v in losses.items() if k != "total" and not is_finite(v)), "total")
        value = losses[bad]
        value = value.item() if isinstance(value, Tensor) and value.numel() == 1 else value
        raise NaNLossError(f"loss/{bad} became {value}; {weights}")


def check_finite_metrics(metrics: Mapping[str, float]) -> None:
    """Raise `NaNLossError` naming the first ``loss/...`` metric that is not finite. A
    learner on a GPU checks its losses here, once per iteration when its metrics reach the
    host, instead of in every `gradients` call (a host synchronisation per gradient step);
    its weights in memory may then have taken the bad steps, and the training loop saves
    nothing after the error."""
    for name, value in metrics.items():
        if name.startswith("loss/") and not math.isfinite(value):
            raise NaNLossError(f"{name} became {value}; the weights in memory are not saved")


def minimize(
    losses: Mapping[str, Loss],
    optimizer: torch.optim.Optimizer,
    max_grad_norm: float | None = None,
    *,
    backend: GradientBackend | None = None,
    scaler: torch.amp.GradScaler | None = None,
    clip_groups: Sequence[Sequence[Tensor]] | None = None,
    before_clip: Callable[[], None] | None = None,
) -> Loss | None:
    """One gradient step on ``losses["total"]``: `gradients`, then `apply_gradients`.
    Returns the gradient norm before clipping (None when ``max_grad_norm`` is None).

    Args:
        losses: the loss terms by name, ``total`` the one minimized (the others only name the
            culprit when it is not finite); a single term needs no ``total``.
        optimizer: steps every parameter of its groups.
        max_grad_norm: clip the global gradient norm to this (None: no clipping).
        backend: a `GradientBackend` in place of autograd and the optimizer's own step.
        scaler: float16 training's gradient scaler (`shoal.core.device.grad_scaler`).
        clip_groups: clip these parameter lists each to ``max_grad_norm`` separately (default:
            all of the optimizer's parameters together).
        before_clip: runs between the backward pass and clipping (DD-PPO's all-reduce).
    """
    parameters = [p for group in optimizer.param_groups for p in group["params"]]
    norm = gradients(
        losses,
        parameters,
        max_grad_norm,
        backend=backend,
        scaler=scaler,
        optimizer=optimizer,
        clip_groups=clip_groups,
        before_clip=before_clip,
    )
    apply_gradients(optimizer, backend=backend, scaler=scaler)
    return norm


def gradients(
    losses: Mapping[str, Loss],
    parameters: Sequence[Tensor],
    max_grad_norm: float | None = None,
    *,
    backend: GradientBackend | None = None,
    scaler: torch.amp.GradScaler | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    clip_groups: Sequence[Sequence[Tensor]] | None = None,
    before_clip: Callable[[], None] | None = None,
) -> Loss | None:
    """The first half of `minimize`: check the losses, backpropagate the total into the
    ``.grad`` of ``parameters`` (replacing what was there), combine (``before_clip``), unscale
    (float16: ``scaler`` with its ``optimizer``) and clip. A3C's workers stop here and send
    the gradients to the driver, which applies them (`apply_gradients`). Returns the norm
    before clipping; a non-finite one raises `NaNLossError` before anything is applied. Only
    losses on the CPU are checked here: a GPU learner's are checked once per iteration
    (`check_finite_metrics`), not with a host synchronisation per step."""
    if _on_host(total_loss(losses)):
        check_finite(losses)
    if backend is None:
        for param in parameters:
            param.grad = None
        total = total_loss(losses)
        assert isinstance(total, Tensor), "backpropagating needs the total as a tensor"
        (total if scaler is None else scaler.scale(total)).backward()
    else:
        backend.backward()
    if before_clip is not None:
        before_clip()
    if max_grad_norm is None:
        return None
    if scaler is not None:
        assert optimizer is not None, "float16's scaler unscales its optimizer's gradients"
        scaler.unscale_(optimizer)
    norm: Loss
    if backend is not None:
        norm = backend.clip(max_grad_norm)
    else:
        norm = _clip(clip_groups or [parameters], max_grad_norm)
    # float16's scaler skips steps with overflowed gradients by design; elsewhere a
    # non-finite norm is a diverged run. On a GPU the check would cost a second host sync
    # per step; there a non-finite gradient shows up as a non-finite loss one step later.
    if scaler is None and _on_host(norm) and not is_finite(norm):
        raise NaNLossError(f"the gradient norm became {float(norm)}; weights left unchanged")
    return norm


def apply_gradients(
    optimizer: torch.optim.Optimizer,
    *,
    backend: GradientBackend | None = None,
    scaler: torch.amp.GradScaler | None = None,
) -> None:
    """The second half of `minimize`: the optimizer's step with the gradients in ``.grad``
    (the backend's own step, or the scaler's, which skips steps with overflowed gradients)."""
    if backend is not None:
        backend.apply(optimizer)
    elif scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer_step(optimizer)


def _on_host(value: Loss) -> bool:
    return not isinstance(value, Tensor) or value.device.type == "cpu"


def _clip(groups: Sequence[Sequence[Tensor]], max_grad_norm: float) -> Tensor:
    """Clip each group to ``max_grad_norm``; the norm of all of them together before."""
    norms = [
        torch.nn.utils.clip_grad_norm_(params, max_grad_norm, foreach=True) for params in groups
    ]
    return norms[0] if len(norms) == 1 else torch.linalg.vector_norm(torch.stack(norms))


def _adam(group: dict, params: list, states: list) -> None:
    beta1, beta2 = group["betas"]
    adam(
        params,
        [p.grad for p in params],
        [s["exp_avg"] for s in states],
        [s["exp_avg_sq"] for s in states],
        [s["max_exp_avg_sq"] for s in states] if group["amsgrad"] else [],
        [s["step"] for s in states],
        foreach=group["foreach"],
        capturable=group["capturable"],
        fused=group["fused"],
        decoupled_weight_decay=group["decoupled_weight_decay"],
        amsgrad=group["amsgrad"],
        beta1=beta1,
        beta2=beta2,
        lr=group["lr"],
        weight_decay=group["weight_decay"],
        eps=group["eps"],
        maximize=group["maximize"],
    )


def _rmsprop(group: dict, params: list, states: list) -> None:
    rmsprop(
        params,
        [p.grad for p in params],
        [s["square_avg"] for s in states],
        [s["grad_avg"] for s in states] if group["centered"] else [],
        [s["momentum_buffer"] for s in states] if group["momentum"] > 0 else [],
        [s["step"] for s in states],
        foreach=group["foreach"],
        maximize=group["maximize"],
        capturable=group["capturable"],
        lr=group["lr"],
        alpha=group["alpha"],
        eps=group["eps"],
        weight_decay=group["weight_decay"],
        momentum=group["momentum"],
        centered=group["centered"],
    )


# Exact types: a subclass may change what step does.
_FUNCTIONAL = {torch.optim.Adam: _adam, torch.optim.AdamW: _adam, torch.optim.RMSprop: _rmsprop}


def optimizer_step(optimizer: torch.optim.Optimizer) -> None:
    """One ``optimizer.step()``; see the module docstring."""
    functional = _FUNCTIONAL.get(type(optimizer))
    groups = optimizer.param_groups
    if functional is not None and len(groups) == 1 and not groups[0]["differentiable"]:
        group = groups[0]
        params = group["params"]
        states = [optimizer.state.get(p) for p in params]
        if all(states) and all(p.grad is not None for p in params):
            with torch.no_grad():
                functional(group, params, states)
            return
    optimizer.step()


def rmsprop_or_adamw(
    kind: str, parameters: list[torch.Tensor], optim: Any, alpha: float, momentum: float = 0.0
) -> torch.optim.Optimizer:
    """The optimizer of A2C, A3C, ACER and IMPALA: ``rmsprop`` (PyTorch's) or ``rmsprop-tf``
    (Mnih et al. 2016's rule as TensorFlow runs it, `shoal.optim.RMSpropTF`), each with
    smoothing ``alpha``, epsilon ``optim.eps`` and weight decay as an L2 term, or ``adam``,
    AdamW (decoupled weight decay); ``optim`` is an `OptimConfig`. All update every parameter
    in a few multi-tensor ops (PyTorch's CPU default loops over the tensors, which costs more
    than the arithmetic on small networks)."""
    kind = kind if kind in ("rmsprop", "rmsprop-tf") else "adamw"
    return build_optimizer(
        parameters, kind, optim.lr, optim.eps, optim.weight_decay, alpha, momentum
    )
