"""Storage: rollouts for on-policy learners (replay buffers arrive with the value-based issue)."""

from shoal.data.rollout import RolloutStorage, space_layout

__all__ = ["RolloutStorage", "space_layout"]
