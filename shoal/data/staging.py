"""Handing a storage's batches to a learner on a GPU: pinned staging buffers the storage owns.

A host-to-GPU copy is asynchronous only from page-locked ("pinned") memory; from ordinary
memory the driver stages it synchronously. `PinnedStaging` keeps pinned buffers for a batch's
tensors (allocated once per field and shape, in two sets used in turn), copies each new batch
into the next set and starts its non-blocking copies to the device, so the learner's batch
is already on its way while the storage gathers the next one. A set is refilled only after
the copies out of it have finished (a CUDA event recorded behind them), so a batch still in
flight is never overwritten. On the CPU there is nothing to stage (`stage_for`).
"""

from __future__ import annotations

from typing import Any, NamedTuple, TypeVar

import torch

B = TypeVar("B", bound=NamedTuple)


class PinnedStaging:
    """Pinned buffers and non-blocking copies to ``device`` (a CUDA device); see the module
    docstring. ``sets``: how many batches may be in flight at once."""

    def __init__(self, device: torch.device, sets: int = 2):
        self.device = device
        self._buffers: list[dict[str, torch.Tensor]] = [{} for _ in range(sets)]
        self._done: list[Any] = [None] * sets
        self._next = 0

    def __call__(self, batch: B) -> B:
        """``batch`` (a NamedTuple) with its CPU tensors on the device; other fields (numpy
        indices, None) as they are."""
        index = self._next
        self._next = (index + 1) % len(self._buffers)
        if self._done[index] is not None:
            self._done[index].synchronize()  # the copies out of this set have finished
        buffers = self._buffers[index]
        fields = []
        for name, value in zip(batch._fields, batch, strict=True):
            if isinstance(value, torch.Tensor) and value.device.type == "cpu":
                pinned = buffers.get(name)
                if pinned is None or pinned.shape != value.shape or pinned.dtype != value.dtype:
                    pinned = torch.empty(value.shape, dtype=value.dtype, pin_memory=True)
                    buffers[name] = pinned
                pinned.copy_(value)
                value = pinned.to(self.device, non_blocking=True)
            fields.append(value)
        done = torch.cuda.Event()
        done.record(torch.cuda.current_stream(self.device))
        self._done[index] = done
        return type(batch)(*fields)


def stage_for(device: torch.device | str | None) -> PinnedStaging | None:
    """The staging a storage feeding a learner on ``device`` needs: pinned buffers for a
    CUDA device, none for the CPU (its batches are used where they are)."""
    if device is None or torch.device(device).type != "cuda":
        return None
    return PinnedStaging(torch.device(device))
