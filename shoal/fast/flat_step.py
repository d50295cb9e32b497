"""`FlatStep`: ``optimizer.step()`` as a dozen NumPy operations on flat buffers.

The fast path keeps the parameters, gradients and optimizer state of a small network each in
one flat buffer (`shoal.fast.mlp`), so an Adam or RMSprop update is a dozen NumPy calls of a few
microseconds instead of a multi-tensor kernel launch per parameter list. The optimizer's state
tensors become views of the flat buffers, so ``optimizer.state_dict()``, checkpoints and
learning-rate changes see no difference. Anything it does not cover (other optimizers or
options, several parameter groups, the first step, which creates the state) goes through
`shoal.optim.optimizer_step`. ``tests/fast/test_flat_step.py`` checks it takes the steps
``optimizer.step()`` takes.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from shoal.optim import optimizer_step

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
        steps = self.steps
        assert steps is not None  # set by _flatten_state
        steps += 1
        if type(self.optimizer) is torch.optim.RMSprop:
            self._rmsprop(group)
        else:
            self._adam(group, float(steps[0]))

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
        found = [self.optimizer.state.get(p) for p in params]
        states = [s for s in found if s]
        if len(states) != len(found) or any(p.grad is None for p in params):
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
