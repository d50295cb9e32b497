"""Configs: frozen dataclasses with a docstring per field (tyro turns them into CLI help) that
validate themselves in ``__post_init__``, so that a bad value fails before any work starts
with a message naming the field and its allowed range.

* `shoal.config.blocks`: the blocks every algorithm shares (run, env, optim, model, ...).
* `shoal.config.checks`: the field checks and the nesting of one config in another.
* `shoal.config.convert`: configs to and from plain data (YAML, JSON, keyword overrides).
* `shoal.config.renames`: the fields and values of earlier versions, still accepted.
"""

from shoal.config.blocks import (
    ENCODERS,
    EnvConfig,
    ModelConfig,
    NoiseConfig,
    OptimConfig,
    ReplayConfig,
    RunConfig,
    SelfPlayConfig,
    check_block,
)
from shoal.config.checks import (
    check,
    check_choices,
    check_multi_agent_learner,
    check_positive,
    check_replay_holds,
    is_nested,
    nested_block,
    unnest,
)
from shoal.config.convert import from_dict, read_yaml, replace, to_dict
from shoal.config.renames import (
    REPLAY_RENAMES,
    Renamed,
    RenamedFieldWarning,
    rename_key,
    renamed_value,
    renames,
    upgrade,
)

__all__ = [
    "ENCODERS",
    "REPLAY_RENAMES",
    "EnvConfig",
    "ModelConfig",
    "NoiseConfig",
    "OptimConfig",
    "Renamed",
    "read_yaml",
    "RenamedFieldWarning",
    "ReplayConfig",
    "RunConfig",
    "SelfPlayConfig",
    "check",
    "check_block",
    "check_choices",
    "check_multi_agent_learner",
    "check_positive",
    "check_replay_holds",
    "from_dict",
    "is_nested",
    "nested_block",
    "rename_key",
    "renamed_value",
    "renames",
    "replace",
    "to_dict",
    "unnest",
    "upgrade",
]
