"""Storage: rollouts for on-policy learners, replay (uniform or prioritized, n-step) for
off-policy ones."""

from shoal.data.prioritized import (
    Priorities,
    ProportionalPriorities,
    RankBasedPriorities,
    SumTree,
    linear_beta,
)
from shoal.data.replay import ReplayBuffer
from shoal.data.rollout import RolloutStorage, space_layout

__all__ = [
    "Priorities",
    "ProportionalPriorities",
    "RankBasedPriorities",
    "ReplayBuffer",
    "RolloutStorage",
    "SumTree",
    "linear_beta",
    "space_layout",
]
