"""TD3+BC (Fujimoto and Gu 2021, "A minimalist approach to offline reinforcement learning",
arXiv:2106.06860): TD3 whose actor also clones the dataset's actions, with the Q term
scaled by ``alpha / mean |Q|`` so that one ``alpha`` fits every reward scale, and
observations standardized by the dataset's statistics (``normalize_obs``).

It is `TD3Learner` with its actor objective passed in (`td3_bc_actor_loss`). Continuous
actions only. TD3's learner and config and DDPG's actor builder come from the
continuous-control family as parts it composes (`shoal.algos.continuous.td3`, whose learner
takes an actor objective for this), and no other internals of that family.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import ClassVar

import gymnasium as gym

from shoal.algos.continuous.ddpg import build_model
from shoal.algos.continuous.td3 import TD3Config, TD3Learner
from shoal.algos.cores import offline as offline_core
from shoal.algos.cores.offline import OfflineAlgorithm, OfflineConfig
from shoal.algos.spec import AlgorithmSpec
from shoal.config import NoiseConfig, check_positive
from shoal.config.usage import Gate
from shoal.core.errors import UnsupportedSpaceError
from shoal.distributed.collective import global_mean
from shoal.losses.offline import td3_bc_actor_loss


@dataclass(frozen=True)
class TD3BCConfig(OfflineConfig, TD3Config):
    """TD3+BC's settings (the paper's: alpha 2.5, lr 3e-4, TD3's policy delay and target
    smoothing); the TD3 and offline settings are documented on `TD3Config` and
    `OfflineConfig`."""

    alpha: float = 2.5
    """Weight of the Q term against behaviour cloning (after scaling by 1 / mean |Q|)."""
    noise: NoiseConfig = field(default_factory=lambda: NoiseConfig(kind="gaussian", scale=0.1))
    """Exploration noise (used online only; TD3+BC learns offline)."""

    ONLINE: ClassVar[bool] = False
    GATES: ClassVar[dict[str, Gate | None]] = {
        **OfflineConfig.GATES,
        "run.runners": None,  # never online: refused by name (its spec's no_runners)
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive(self, "alpha")


def td3_bc_learner(config: TD3BCConfig, obs_space: gym.Space, action_space: gym.Space):
    if not isinstance(action_space, gym.spaces.Box):
        raise UnsupportedSpaceError(
            f"TD3+BC needs continuous (Box) actions, and the dataset's are {action_space}; "
            "for discrete actions use bc, cql or iql"
        )
    objective = functools.partial(_objective, alpha=config.alpha)
    return TD3Learner(config, obs_space, action_space, actor_objective=objective)


def _objective(q, policy_actions, data_actions, alpha):
    # Over the whole batch also where a learner group's rank holds only some of its rows.
    mean_abs_q = global_mean(q.abs())
    return td3_bc_actor_loss(q, policy_actions, data_actions, alpha, mean_abs_q)


class TD3BC(OfflineAlgorithm):
    def __init__(self, config: TD3BCConfig):
        super().__init__(config, td3_bc_learner, build_model)


SPECS = (
    AlgorithmSpec(
        "td3-bc",
        TD3BCConfig,
        TD3BC,
        build_model,
        "TD3+BC: TD3 whose actor also clones the dataset's actions (offline)",
        "Box (bounded)",
        prepare=offline_core.prepare,
        counts=offline_core.counts,
        own_spaces=True,
        extra_evaluation=True,
        no_runners="learns from its dataset only, never acting in an env",
        learner_groups=True,
    ),
)
"""The names this module registers (`shoal.algos.spec`, `shoal.registry`)."""
