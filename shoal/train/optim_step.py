"""Faster optimizer steps for the small networks of control tasks.

* `optimizer_step`: ``optimizer.step()`` for Adam, AdamW and RMSprop through PyTorch's
  functional optimizer API. ``Optimizer.step`` wraps the arithmetic in hook dispatch, a profiler
  record, grad-mode switching and a scan of every parameter's state; on a small network that
  costs more than the update itself (measured on a 64x64 actor-critic: 46 us for the wrapper
  against 29 us through the functional API, one thread). The functional API
  (``torch.optim.adam.adam``, ``torch.optim.rmsprop.rmsprop``) is the same code ``step`` calls,
  with the optimizer's own state tensors and hyperparameters.
* `FlatStep`: the same updates as a dozen NumPy operations on one flat buffer, for parameters,
  gradients and optimizer state that all live in flat buffers (`shoal.nn.direct_grad` keeps
  them so): a few microseconds per operation instead of a multi-tensor kernel launch per
  parameter list. The optimizer's state tensors become views of the flat buffers, so
  ``optimizer.state_dict()``, checkpoints and learning-rate changes see no difference.

Anything they do not cover (other optimizers or options, several parameter groups, a parameter
without a gradient, the first step, which creates the state) goes through ``optimizer.step()``.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch.optim.adam import adam
from torch.optim.rmsprop import rmsprop


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


# The optimizer state FlatStep keeps flat, per optimizer type.
_FLAT_STATE = {
    torch.optim.Adam: ("exp_avg", "exp_avg_sq"),
    torch.optim.AdamW: ("exp_avg", "exp_avg_sq"),
    torch.optim.RMSprop: ("square_avg",),
}


class FlatStep:
    """``optimizer.step()`` as NumPy operations on flat buffers.

    ``flat_param`` and ``flat_grad`` are 1-D float32 CPU tensors; ``optimizer``'s single
    parameter group must hold views of ``flat_param`` that cover it in order, with their
    ``.grad`` the matching views of ``flat_grad``. Supported: Adam and AdamW (no amsgrad, no
    maximize) and RMSprop (no momentum, not centered, no maximize); anything else, and the
    first step, goes through ``optimizer.step()``."""

    def __init__(
        self, optimizer: torch.optim.Optimizer, flat_param: torch.Tensor, flat_grad: torch.Tensor
    ):
        self.optimizer = optimizer
        self.param = flat_param.numpy()
        self.grad = flat_grad.numpy()
        self.keys = _FLAT_STATE.get(type(optimizer), ())
        self.views: list[torch.Tensor] = []
        """The state tensors handed to the optimizer; a mismatch means it was reloaded."""
        self.buffers: dict[str, np.ndarray] = {}
        self.steps: np.ndarray | None = None

    def supported(self) -> bool:
        groups = self.optimizer.param_groups
        if not self.keys or len(groups) != 1:
            return False
        group = groups[0]
        if group.get("maximize") or group.get("differentiable") or group.get("amsgrad"):
            return False
        return not (group.get("centered") or group.get("momentum"))

    def step(self) -> None:
        if not self._state_is_flat() and not self._flatten_state():
            optimizer_step(self.optimizer)
            return
        group = self.optimizer.param_groups[0]
        self.steps += 1
        if type(self.optimizer) is torch.optim.RMSprop:
            self._rmsprop(group)
        else:
            self._adam(group, float(self.steps[0]))

    def _state_is_flat(self) -> bool:
        if self.steps is None:
            return False
        state = self.optimizer.state
        params = self.optimizer.param_groups[0]["params"]
        index = 0
        for param in params:
            param_state = state.get(param)
            if param_state is None:
                return False
            for key in (*self.keys, "step"):
                if param_state.get(key) is not self.views[index]:
                    return False
                index += 1
        return True

    def _flatten_state(self) -> bool:
        """Move the optimizer's state into flat buffers, its tensors becoming views of them;
        False when the state is not there yet (before the first step) or not flat-able."""
        if not self.supported():
            return False
        params = self.optimizer.param_groups[0]["params"]
        states = [self.optimizer.state.get(p) for p in params]
        if not all(states) or any(p.grad is None for p in params):
            return False
        steps = [float(s["step"]) for s in states]
        if len(set(steps)) != 1 or sum(p.numel() for p in params) != self.param.size:
            return False
        flats = {key: torch.cat([s[key].flatten() for s in states]) for key in self.keys}
        flat_steps = torch.tensor(steps, dtype=states[0]["step"].dtype)
        self.views = []
        offset = 0
        for index, (param, state) in enumerate(zip(params, states, strict=True)):
            size = param.numel()
            for key in self.keys:
                state[key] = flats[key][offset : offset + size].view_as(param)
                self.views.append(state[key])
            state["step"] = flat_steps[index]
            self.views.append(state["step"])
            offset += size
        self.buffers = {key: flat.numpy() for key, flat in flats.items()}
        self.steps = flat_steps.numpy()
        return True

    def _adam(self, group: dict, step: float) -> None:
        """torch.optim.Adam / AdamW's update (its single-tensor formulation)."""
        lr, (beta1, beta2), eps = group["lr"], group["betas"], group["eps"]
        param, grad, weight_decay = self.param, self.grad, group["weight_decay"]
        exp_avg, exp_avg_sq = self.buffers["exp_avg"], self.buffers["exp_avg_sq"]
        if weight_decay:
            if type(self.optimizer) is torch.optim.AdamW:
                param *= np.float32(1.0 - lr * weight_decay)
            else:
                grad = grad + np.float32(weight_decay) * param
        exp_avg *= np.float32(beta1)
        exp_avg += np.float32(1.0 - beta1) * grad
        exp_avg_sq *= np.float32(beta2)
        exp_avg_sq += np.float32(1.0 - beta2) * grad * grad
        denom = np.sqrt(exp_avg_sq)
        denom *= np.float32(1.0 / math.sqrt(1.0 - beta2**step))
        denom += np.float32(eps)
        update = np.divide(exp_avg, denom, out=denom)
        update *= np.float32(lr / (1.0 - beta1**step))
        param -= update

    def _rmsprop(self, group: dict) -> None:
        """torch.optim.RMSprop's update without momentum or centering."""
        lr, alpha, eps = group["lr"], group["alpha"], group["eps"]
        param, grad, weight_decay = self.param, self.grad, group["weight_decay"]
        square_avg = self.buffers["square_avg"]
        if weight_decay:
            grad = grad + np.float32(weight_decay) * param
        square_avg *= np.float32(alpha)
        square_avg += np.float32(1.0 - alpha) * grad * grad
        denom = np.sqrt(square_avg)
        denom += np.float32(eps)
        update = np.divide(grad, denom, out=denom)
        update *= np.float32(lr)
        param -= update
