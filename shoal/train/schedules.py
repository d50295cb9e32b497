"""Hyperparameter schedules as plain functions of training progress in [0, 1].

Schedules are recomputed from the env-step counter every iteration instead of being stepped,
so a resumed run needs no schedule state to continue exactly.
"""

from __future__ import annotations


def linear(start: float, end: float, progress: float) -> float:
    """Interpolate from ``start`` at progress 0 to ``end`` at progress 1 (clamped)."""
    progress = min(max(progress, 0.0), 1.0)
    return start + (end - start) * progress


def scheduled(kind: str, start: float, progress: float, end: float = 0.0) -> float:
    """``start`` for a constant schedule, the linear interpolation to ``end`` otherwise."""
    if kind == "constant":
        return start
    if kind == "linear":
        return linear(start, end, progress)
    raise ValueError(f"unknown schedule {kind!r}; expected 'constant' or 'linear'")
