"""What environments can be made here: the ids ``shoal list --envs`` shows, grouped, and the
registered ids that cannot be made on this machine with the reason why."""

from __future__ import annotations

import importlib
import importlib.util
import re
from dataclasses import dataclass, field

import gymnasium as gym

from shoal.envs.ids import register_ale_envs
from shoal.envs.multi_agent import PETTINGZOO_PREFIX, multi_agent_ids

GROUPS = (
    ("gymnasium.envs.classic_control", "Gymnasium classic control"),
    ("gymnasium.envs.toy_text", "Gymnasium toy text"),
    ("gymnasium.envs.box2d", "Gymnasium Box2D"),
    ("gymnasium.envs.mujoco", "MuJoCo (Gymnasium)"),
    ("gymnasium.envs.phys2d", "Gymnasium functional (JAX)"),
    ("gymnasium.envs.tabular", "Gymnasium functional (JAX)"),
    ("shoal.", "shoal built-in, single agent"),
)  # in the order they are listed, Atari and the multi-agent envs after them
ATARI = "Atari (ale-py)"


@dataclass
class EnvGroup:
    title: str
    ids: list[str] = field(default_factory=list)
    note: str = ""


@dataclass
class Catalog:
    groups: list[EnvGroup]
    unavailable: list[tuple[str, str]]
    """``(id, reason)`` of registered ids that cannot be made here."""


def catalog() -> Catalog:
    """Every registered env id, grouped by where it comes from, with the ids that cannot be
    made here (a missing dependency, or gone from Gymnasium) set apart with the reason."""
    _register_optional_envs()
    groups: dict[str, EnvGroup] = {}
    unavailable: list[tuple[str, str]] = []
    reasons: dict[str, str | None] = {}
    for env_id, spec in sorted(gym.envs.registry.items()):
        module = _entry_module(spec)
        if module is None:
            unavailable.append((env_id, _callable_reason(spec)))
            continue
        if module not in reasons:
            reasons[module] = _import_problem(module)
        if reasons[module] is not None:
            unavailable.append((env_id, reasons[module] or ""))
            continue
        title = ATARI if module.startswith("ale_py") else _group_title(module)
        groups.setdefault(title, EnvGroup(title)).ids.append(env_id)
    if ATARI in groups:
        groups[ATARI] = _compact_atari(groups[ATARI].ids)
    groups["shoal multi-agent"] = EnvGroup(
        "shoal built-in, multi-agent", multi_agent_ids(), "one row per agent (AgentsAsBatch)"
    )
    groups["PettingZoo"] = EnvGroup("PettingZoo", [], _pettingzoo_note())
    order = [title for _, title in GROUPS] + [ATARI, "shoal multi-agent", "PettingZoo"]
    ranked = sorted(groups.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else 99)
    return Catalog([group for _, group in ranked], unavailable)


def unusable_reason(env_id: str, error: BaseException) -> str:
    """One line on why the registered ``env_id`` could not be made (``error`` is what making
    it raised), naming a usable newer version where there is one."""
    spec = gym.envs.registry.get(env_id)
    module = None if spec is None else _entry_module(spec)
    if spec is not None and module is None:
        return _callable_reason(spec)
    if module is not None and (problem := _import_problem(module)) is not None:
        return problem
    text = str(error).strip()
    return f"needs a package that is not installed: {text.splitlines()[0] if text else error!r}"


def _register_optional_envs() -> None:
    """Register the ids of optional packages that register on import (ale-py's Atari)."""
    register_ale_envs()


def _entry_module(spec: gym.envs.registration.EnvSpec) -> str | None:
    entry = spec.entry_point
    if isinstance(entry, str):
        return entry.partition(":")[0]
    if getattr(entry, "__name__", "").startswith("_raise"):
        return None  # Gymnasium's placeholder for an id it no longer provides
    return getattr(entry, "__module__", None) or "?"


def _callable_reason(spec: gym.envs.registration.EnvSpec) -> str:
    name = getattr(spec.entry_point, "__name__", "")
    if "mujoco_py" in name:
        newer = re.sub(r"-v\d+$", "-v5", spec.id)
        hint = f"; use {newer}" if newer in gym.envs.registry else ""
        return f"needs mujoco-py (the old MuJoCo bindings, moved to gymnasium-robotics){hint}"
    if "shimmy" in name:
        return "needs shimmy (environments of the old gym package)"
    return "Gymnasium registers it without an implementation"


def _import_problem(module: str) -> str | None:
    """None when ``module`` imports, else the first line of why not."""
    try:
        importlib.import_module(module)
    except Exception as exc:  # a missing dependency raises ImportError or Gymnasium's own
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return f"needs a package that is not installed: {text}"
    return None


def _group_title(module: str) -> str:
    for prefix, title in GROUPS:
        if module.startswith(prefix):
            return title
    return f"other ({module.partition('.')[0]})"


def _compact_atari(ids: list[str]) -> EnvGroup:
    """The Atari games by name instead of their several hundred ids."""
    games = sorted(
        {m.group(1) for i in ids if (m := re.fullmatch(r"ALE/([A-Za-z]+)-v5", i)) is not None}
    )
    note = (
        f"{len(ids)} ids for {len(games)} games: ALE/<Game>-v5 (sticky actions) and "
        "<Game>NoFrameskip-v4 (with --env.atari deepmind), plus -ram and older variants"
    )
    return EnvGroup(ATARI, games, note)


def _pettingzoo_note() -> str:
    if importlib.util.find_spec("pettingzoo") is None:
        return "not installed (pip install 'shoal[pettingzoo]')"
    return (
        f"any parallel env as {PETTINGZOO_PREFIX}<module>.<env>, e.g. "
        f"{PETTINGZOO_PREFIX}mpe2.simple_spread_v3 or "
        f"{PETTINGZOO_PREFIX}pettingzoo.butterfly.cooperative_pong_v5"
    )
