"""Which settings a run reads, so that none is accepted and then ignored.

Two declarations, checked before a run starts (`check_usage`) and kept true by a test that
trains every registered algorithm while recording the config fields its code reads
(``tests/test_config_usage.py``):

* A config block's ``GATES``: fields read only when another setting opens them, such as
  ``replay.priority_alpha`` with prioritized replay, or DQN's ``num_atoms`` with its C51
  head. ``{field: Gate(on, test, words)}``, both names relative to the block.
* An algorithm config's ``UNUSED``: fields it never reads (its blocks are shared with other
  algorithms: SAC has no softmax temperature, behaviour cloning no critic),
  ``{dotted field: why}``.

A field declared unused that differs from the algorithm's own default is refused by name;
a gated one set while its gate is closed is named in an `UnreadSettingWarning`.
Fields whose use depends on the env's spaces (a Gaussian policy's ``init_log_std`` on Box
actions, ``encoder_activation`` on images) are read where the env has them; their
docstrings say where (`SPACE_DEPENDENT`).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from shoal.core.errors import ConfigError


@dataclass(frozen=True)
class Gate:
    """A field read only when ``test`` holds for the value of ``on`` (a dotted name relative
    to the block that declares the gate; "" for the block itself); ``words`` says when, for
    the refusal. An algorithm config's ``GATES`` may name a nested block's field (dotted) to
    replace that block's gate, or map it to None: always read."""

    on: str
    test: Callable[[Any], bool]
    words: str


SPACE_DEPENDENT: dict[str, str] = {
    "env.vectorization": "Gymnasium envs (multi-agent and game envs step themselves)",
    "env.atari": "ALE ids",
    "env.atari_training": "ALE ids with env.atari deepmind",
    "env.action_mask": "single-agent envs that report legal actions",
    "env.group": "multi-agent envs",
    "env.agent_id": "multi-agent envs",
    "env.global_state": "multi-agent envs",
    "env.opponents": "multi-agent envs",
    "env.policy_map": "multi-agent envs",
    "env.policy_per_agent": "multi-agent envs",
    "model.init_log_std": "Box actions (a Gaussian policy)",
    "model.temperature": "Discrete actions (a softmax policy)",
    "model.temperature_min": "Discrete actions (a softmax policy)",
    "model.encoder_activation": "image observations (an image encoder)",
    "model.key_hidden": "Dict and Tuple observations",
    "model.policy_head": "the actor-critics' policy heads",
    "policies": "multi-agent envs whose groups have several policies",
    "sdn_samples": "Box actions (ACER's stochastic dueling network)",
}
"""Fields read only on envs whose spaces call for them, with where: a test of every
algorithm on its default env cannot see them read, and a config check cannot know the env's
spaces (``tests/test_config_usage.py`` exempts them by this list)."""


IN_STEP = {"replay.max_lag": "it samples in step with its learning (no sampling ahead)"}
"""For the replay learners that do not sample asynchronously."""
OWN_GAMMA = {"env.gamma": "its reward normalization discounts with its own gamma"}
"""For the algorithms that copy their ``gamma`` into ``env.gamma``."""
NO_COMPILE = {"run.compile": "it trains no network step to compile"}
SEPARATE_NETWORKS = {"model.shared_trunk": "its actor and critics are separate networks"}
NO_LSTM = {"model.lstm_hidden": "it has no recurrent model"}
NO_LR_SCHEDULE = {"optim.lr_schedule": "its learning rate is constant, without a schedule"}
CONSTANT_LR = {
    "optim.lr_schedule": "its learning rate is constant, without a schedule",
    "optim.anneal_steps": "its learning rate is constant, without a schedule",
}


def value_at(config: Any, path: str) -> Any:
    for part in path.split(".") if path else ():
        config = getattr(config, part)
    return config


def _blocks(config: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``(path prefix, block)`` for ``config`` and every nested config block in it."""
    yield prefix, config
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            yield from _blocks(value, f"{prefix}{f.name}.")


def closed_gates(config: Any) -> dict[str, str]:
    """``{dotted field: when it is read}`` for every gated field whose gate ``config``
    keeps closed."""
    gates: dict[str, tuple[Any, Gate | None]] = {}
    for prefix, block in reversed(list(_blocks(config))):  # outer blocks' gates win
        for name, gate in getattr(type(block), "GATES", {}).items():
            gates[f"{prefix}{name}"] = (block, gate)
    return {
        path: f"it is read only {gate.words}"
        for path, (block, gate) in gates.items()
        if gate is not None and not gate.test(value_at(block, gate.on))
    }


def unused(config: Any) -> dict[str, str]:
    """``{dotted field: why}``: the fields ``config``'s algorithm never reads (a nested
    block's own declarations included, under its name)."""
    found: dict[str, str] = {}
    for prefix, block in _blocks(config):
        for name, why in getattr(type(block), "UNUSED", {}).items():
            found.setdefault(f"{prefix}{name}", why)
    return found


class UnreadSettingWarning(UserWarning):
    """A setting that the run's other settings keep closed (`Gate`): it takes effect only
    when they open it."""


def check_usage(config: Any, base: Any, name: str) -> None:
    """Refuse a field that ``config``'s algorithm (``name``) never reads, set to another value
    than ``base`` (the algorithm's default config) has; warn, naming it, about a gated field
    so set while its gate is closed (a tuned example's QMIX mixer sizes, with the mixer
    switched to vdn: they take effect again with mixer qmix)."""
    for path, why in unused(config).items():
        value, default = value_at(config, path), value_at(base, path)
        if value != default:
            raise ConfigError(
                f"{type(config).__name__}.{path} = {value!r} is not read by {name}: {why}; "
                f"leave it at its default ({default!r})"
            )
    for path, why in closed_gates(config).items():
        value, default = value_at(config, path), value_at(base, path)
        if value != default:
            warnings.warn(
                f"{type(config).__name__}.{path} = {value!r} has no effect in this run of "
                f"{name}: {why}",
                UnreadSettingWarning,
                stacklevel=2,
            )
