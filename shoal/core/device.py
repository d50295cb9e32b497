"""Devices: where a run's learner computes (``run.device``), and moving batches there.

Learners keep their networks, optimizer state and batches on the run's device; samplers act on the
CPU with a copy of the weights; replay storage stays in host memory and hands its batches over as
pinned, non-blocking copies (`shoal.data.staging`); `to_device` moves the rest. ``auto`` picks CUDA
when this process sees a GPU and the CPU otherwise, so a config runs unchanged on a laptop and a GPU
box.
"""

from __future__ import annotations

import re
from typing import Any, TypeVar

import torch

from shoal.core.errors import ConfigError

T = TypeVar("T")

DEVICE_NAMES = "auto, cpu, cuda or cuda:N"
_PATTERN = re.compile(r"auto|cpu|cuda(:\d+)?")


def valid_device_name(name: str) -> bool:
    """Whether ``name`` is a device name shoal accepts (it may still be unavailable here)."""
    return isinstance(name, str) and _PATTERN.fullmatch(name) is not None


def available_devices() -> str:
    """The devices this process can train on, for error messages: ``cpu`` and each GPU."""
    names = ["cpu"]
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            names.append(f"cuda:{index} ({torch.cuda.get_device_name(index)})")
    return ", ".join(names)


def resolve_device(name: str, field: str = "run.device") -> torch.device:
    """The `torch.device` for ``name`` (auto, cpu, cuda, cuda:N); a `ConfigError` naming
    ``field`` and the available devices when this process cannot use it."""
    if not valid_device_name(name):
        raise ConfigError(f"{field} = {name!r} is invalid: must be {DEVICE_NAMES}")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = 0 if device.index is None else device.index
        if index >= count:
            raise ConfigError(
                f"{field} = {name!r} is not available here (available: {available_devices()}); "
                "use run.device cpu or auto"
            )
    return device


def to_device(value: T, device: torch.device, non_blocking: bool = True) -> T:
    """``value`` (a tensor, or tuples, NamedTuples, lists and dicts of them) with every tensor
    on ``device``; tensors already there are left alone (on the CPU nothing is copied). A
    storage that feeds a GPU learner every step hands its batches over already on the device,
    through pinned staging buffers of its own (`shoal.data.staging`); what comes here from
    ordinary host memory (a rollout once per update) is copied as it is."""
    if isinstance(value, torch.Tensor):
        if value.device == device:
            return value
        return value.to(device, non_blocking=non_blocking)  # type: ignore[return-value]
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a NamedTuple batch
        return type(value)(*(to_device(v, device, non_blocking) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(to_device(v, device, non_blocking) for v in value)
    if isinstance(value, dict):
        return {k: to_device(v, device, non_blocking) for k, v in value.items()}  # type: ignore[return-value]
    return value


def to_host(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Detached tensors of ``tensors`` on the CPU: weights for samplers, Ray and checkpoints
    (CPU tensors are returned as they are, sharing memory)."""
    return {
        k: v.detach() if v.device.type == "cpu" else v.detach().cpu() for k, v in tensors.items()
    }


def autocast_dtype(precision: str) -> torch.dtype | None:
    """The autocast dtype of a ``model.precision`` (None: float32, no autocast)."""
    return {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(precision)


def grad_scaler(precision: str, device: torch.device) -> torch.amp.GradScaler | None:
    """The gradient scaler float16 training needs (its small range would flush small
    gradients to zero); None for float32 and bfloat16, which keep float32's exponent range."""
    if precision != "float16":
        return None
    return torch.amp.GradScaler(device.type)


def check_precision(precision: str, device: torch.device, field: str = "model.precision") -> None:
    """float16 autocast and its gradient scaler are CUDA features: refuse them elsewhere."""
    if precision == "float16" and device.type != "cuda":
        raise ConfigError(
            f"{field} = 'float16' needs a CUDA device (run.device is {device}); use bfloat16 "
            "on the CPU"
        )


def scaler_state(scaler: torch.amp.GradScaler | None) -> dict[str, Any]:
    """``{"scaler": its state}`` for a learner's checkpoint, or nothing without a scaler
    (float16's loss scale and growth counters: exact resume needs them)."""
    return {} if scaler is None else {"scaler": scaler.state_dict()}


def load_scaler_state(scaler: torch.amp.GradScaler | None, state: dict[str, Any]) -> None:
    if scaler is not None and "scaler" in state:
        scaler.load_state_dict(state["scaler"])
