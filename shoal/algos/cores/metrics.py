"""An update's metrics: a gradient step's row, and the mean over the steps of an update."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from shoal.optim import check_finite_metrics


def mean_metrics(rows: Iterable[dict[str, Any]]) -> dict[str, float]:
    """Per-name means over steps of metrics that are tensors (kept on their device until here:
    one conversion per update, not one per step) or floats."""
    rows = list(rows)
    names = list(rows[0])
    tensors = isinstance(rows[0][names[0]], torch.Tensor)
    if len(rows) == 1 and not tensors:
        return {name: float(value) for name, value in rows[0].items()}
    if tensors:
        table = torch.stack([torch.stack([row[k] for k in names]).float() for row in rows])
        means = dict(zip(names, table.mean(0).tolist(), strict=True))
        check_finite_metrics(means)  # a GPU learner's NaN check (`shoal.optim.gradients`)
        return means
    array = np.array([[row[k] for k in names] for row in rows], dtype=np.float64)
    return dict(zip(names, array.mean(0).tolist(), strict=True))


def step_metrics(losses: dict[str, Any], stats: dict[str, Any]) -> dict[str, Any]:
    """One gradient step's loss terms as ``loss/<name>`` and diagnostics as ``train/<name>``."""
    row = {f"loss/{name}": value for name, value in losses.items()}
    row.update((f"train/{name}", value) for name, value in stats.items())
    return row
