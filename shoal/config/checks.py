"""The checks every config block runs in ``__post_init__``, each failure a `ConfigError` naming
the field and its allowed range, and the nesting of one algorithm's config block in another's
(DD-PPO's ``ppo``, Ape-X's ``dqn``)."""

from __future__ import annotations

import dataclasses
import functools
import math
import typing
from typing import Any, Literal, TypeVar

from shoal.core.errors import ConfigError

T = TypeVar("T")


def check(owner: object, name: str, ok: bool, allowed: str) -> None:
    """Raise a `ConfigError` naming ``owner.name`` and the allowed range unless ``ok``."""
    if not ok:
        value = getattr(owner, name)
        raise ConfigError(f"{type(owner).__name__}.{name} = {value!r} is invalid: {allowed}")


def check_multi_agent_learner(config: Any, algo: str, opponents: bool = False) -> None:
    """What the multi-agent learners with networks of their own refuse instead of ignoring:
    an image or custom ``model.encoder`` (their agent-batched networks read flat
    observations through MLPs), ``env.opponents`` unless they take fixed opponents
    (``opponents``; MADDPG and CTEDD train every group they step) and the policy maps of
    MAPPO and IPPO."""
    check(
        config.model,
        "encoder",
        config.model.encoder == "mlp",
        f"{algo}'s agent-batched networks read flat observations through MLPs; image and "
        "custom encoders serve the single-agent families",
    )
    check(
        config.env,
        "opponents",
        opponents or not config.env.opponents,
        f"{algo} trains every agent group of its env; env.opponents serves MAPPO, IPPO and "
        "QMIX/VDN/IQL",
    )
    check(
        config.env,
        "policy_map",
        not config.env.policy_map and not config.env.policy_per_agent,
        f"{algo} has its own networks per agent; env.policy_map and env.policy_per_agent "
        "choose the policies of MAPPO and IPPO",
    )


def check_numbers(config: object) -> None:
    """Refuse a NaN anywhere in ``config`` and its nested blocks (tuples included): no field
    means anything by it, a field without a range check would take it silently, and it
    makes the run's config.json invalid JSON."""
    for f in dataclasses.fields(typing.cast(Any, config)):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            check_numbers(value)
            continue
        values = value if isinstance(value, tuple) else (value,)
        is_nan = any(isinstance(v, float) and math.isnan(v) for v in values)
        check(config, f.name, not is_nan, "must be a number")


def check_positive(owner: object, *names: str) -> None:
    for name in names:
        check(owner, name, getattr(owner, name) > 0, "must be > 0")


def check_choices(owner: object) -> None:
    """Check every ``Literal``-typed field against its choices (the type hint alone checks
    nothing outside the CLI, e.g. for YAML files and Python callers)."""
    for name, choices in _literal_fields(typing.cast(Any, type(owner))).items():
        allowed = "must be one of " + ", ".join(map(repr, choices))
        check(owner, name, getattr(owner, name) in choices, allowed)


@functools.cache
def _literal_fields(cls: type) -> dict[str, tuple[Any, ...]]:
    hints = typing.get_type_hints(cls)
    return {
        f.name: typing.get_args(hints[f.name])
        for f in dataclasses.fields(cls)
        if typing.get_origin(hints[f.name]) is Literal
    }


def nested_block(cls: type[T]) -> type[T]:
    """``cls`` as a block nested in a variant's config (DD-PPO's ``ppo``, Ape-X's ``dqn``): the
    same fields and checks, except those that depend on ``run`` and ``env``, which the variant
    runs on the block with its own ``run`` and ``env`` (`unnest`). The block's own run and env
    are not used."""
    namespace = {"NESTED": True, "__doc__": cls.__doc__, "__module__": cls.__module__}
    return typing.cast(type[T], type(cls.__name__, (cls,), namespace))


def is_nested(config: object) -> bool:
    """Whether ``config`` is a `nested_block` (its run- and env-dependent checks wait)."""
    return getattr(type(config), "NESTED", False)


def unnest(block: T, **changes: Any) -> T:
    """The plain config a `nested_block` stands for, with ``changes`` (the variant's run and
    env), validated in full."""
    cls = type(block).__mro__[1] if is_nested(block) else type(block)
    fields = dataclasses.fields(typing.cast(Any, block))
    values = {f.name: getattr(block, f.name) for f in fields if f.init}
    return typing.cast(T, cls(**{**values, **changes}))


def check_replay_holds(owner: object, num_envs: int) -> None:
    """``owner.replay.buffer_size`` must hold the n-step windows of ``num_envs`` envs on each
    of ``run.runners`` runners, and sampling ahead (``replay.max_lag``) needs runners (left to
    the variant for a `nested_block`)."""
    if is_nested(owner):
        return
    config = typing.cast(Any, owner)
    replay, runners = config.replay, max(1, config.run.runners)
    envs = num_envs * runners
    check(
        replay,
        "buffer_size",
        replay.buffer_size >= envs * (replay.n_step + 2),
        f"must hold at least replay.n_step + 2 steps of {envs} envs",
    )
    check(
        replay,
        "max_lag",
        replay.max_lag == 0 or config.run.runners >= 1,
        "> 0 needs run.runners >= 1: sampling ahead in the learner's process would draw its "
        "actions from the learner's torch generator at times the threads decide, and a seeded "
        "run would not repeat",
    )
