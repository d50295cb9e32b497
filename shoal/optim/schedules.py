"""Hyperparameter schedules as plain functions of training progress in [0, 1].

Schedules are recomputed from the env-step counter every iteration instead of being stepped,
so a resumed run needs no schedule state to continue exactly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shoal.config import ModelConfig


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


def annealed_temperature(model: ModelConfig, env_steps: int, episodes: int) -> float:
    """Softmax temperature of categorical policies after ``env_steps`` env steps and
    ``episodes`` finished episodes: linear from ``model.temperature`` to
    ``model.temperature_min`` over ``model.temperature_anneal`` steps or episodes (as
    ``model.temperature_unit`` says), then constant (Lamb et al., "Deep Reinforcement
    Learning with Actor-Critic", UC San Diego). Constant ``model.temperature`` when
    ``temperature_min`` is None."""
    if model.temperature_min is None:
        return model.temperature
    done = env_steps if model.temperature_unit == "steps" else episodes
    return linear(model.temperature, model.temperature_min, done / model.temperature_anneal)
