"""An experiment file planned: its grid of configs times seeds expanded into runs, each
config built and checked before any run starts (`plan`); `shoal.experiment` runs them.

The file::

    name: lr-sweep                  # default: the file's name
    base: ppo-cartpole              # a tuned example (name or YAML path); or `algo: ppo`
    config:                         # overrides of the base, for every run
      run: {total_steps: 50000}
    axes:                           # one variant per combination of the values
      optim.lr: [0.001, 0.0003]
      num_epochs: [4, 10]
    seeds: 3                        # runs per variant
    seed: 0                         # the runs' seeds derive from it

An axis names a config field with dots (the close matches are listed when none exists), or
``algo`` / ``base`` to vary the algorithm or the tuned example. ``variants`` (a mapping of
names to their own ``base`` or ``algo`` and ``config``, merged over the file's) lists
configs that differ in more than one field; the axes then cross every variant. Run ``k`` of
a variant trains with ``derive_seed(seed, variant, k)``: distinct seeds, and the same file
gives the same runs. A variant with ``seeds_of: OTHER`` takes OTHER's seeds instead (run
``k`` of both trains with one seed), so that a comparison of the two changes one thing, not
the seed as well.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import itertools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shoal.config import from_dict, read_yaml
from shoal.core.errors import ConfigError
from shoal.core.seeding import derive_seed
from shoal.registry import find_tuned, get_algorithm

SPECIAL_AXES = ("algo", "base")


@dataclass(frozen=True)
class PlannedRun:
    """One run of an experiment: its name (``<variant>-s<k>``), variant, axis values, seed,
    algorithm and full config (a dict, as ``config.json`` holds it)."""

    name: str
    variant: str
    values: dict[str, Any]
    seed: int
    algo: str
    config: dict[str, Any]


@dataclass
class Experiment:
    name: str
    directory: Path
    runs: list[PlannedRun]
    source: dict[str, Any] = field(default_factory=dict)

    @property
    def fingerprint(self) -> str:
        """A hash of every run's name and config: what makes two plans the same."""
        text = json.dumps([(r.name, r.algo, r.config) for r in self.runs], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def read_spec(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"experiment file {path} does not exist")
    spec = read_yaml(path) or {}
    if not isinstance(spec, dict):
        raise ConfigError(f"{path}: an experiment file is a mapping (name, base, axes, seeds)")
    spec.setdefault("name", path.stem)
    return spec


def variant_name(values: dict[str, Any]) -> str:
    if not values:
        return "base"
    parts = [f"{key}={value}" for key, value in values.items()]
    text = ",".join(parts).replace("/", "_").replace(" ", "")
    return text if len(text) <= 80 else hashlib.sha256(text.encode()).hexdigest()[:12]


def plan(spec: dict[str, Any], directory: str | Path | None = None) -> Experiment:
    """Expand ``spec`` (an experiment file's contents) into its runs, building and checking
    every config."""
    known = {"name", "base", "algo", "config", "axes", "variants", "seeds", "seed", "description"}
    unknown = sorted(set(spec) - known)
    if unknown:
        raise ConfigError(f"experiment: unknown keys {unknown}; the keys are {sorted(known)}")
    if not isinstance(spec.get("name"), str) or not spec["name"]:
        raise ConfigError(f"experiment: name is a string, not {spec.get('name')!r}")
    name = spec["name"]
    axes = spec.get("axes") or {}
    if not isinstance(axes, dict) or any(not isinstance(v, list) or not v for v in axes.values()):
        raise ConfigError("experiment: axes map a field to a non-empty list of values")
    seeds = _whole(spec.get("seeds", 1), "seeds")
    if seeds < 1:
        raise ConfigError(f"experiment: seeds must be >= 1, not {seeds}")
    base_seed = _whole(spec.get("seed", 0), "seed")
    if base_seed < 0:
        raise ConfigError(f"experiment: seed must be >= 0, not {base_seed}")
    if not isinstance(spec.get("config") or {}, dict):
        raise ConfigError(f"experiment: config maps fields to values, not {spec['config']!r}")
    root = Path(directory) if directory else Path("runs") / "experiments" / name
    variants = spec.get("variants") or {"": {}}
    if not isinstance(variants, dict) or any(not isinstance(v, dict) for v in variants.values()):
        raise ConfigError("experiment: variants map a name to {base or algo, config}")
    planned = seeds * len(variants) * math.prod(len(values) for values in axes.values())
    if planned > MAX_RUNS:
        raise ConfigError(
            f"experiment: {planned:,} runs (variants x axis values x seeds) is more than an "
            f"experiment plans ({MAX_RUNS:,} at most); is seeds = {seeds} meant?"
        )
    runs = []
    keys = list(axes)
    for label, own in variants.items():
        unknown = sorted(set(own) - {"base", "algo", "config", "seeds_of"})
        if unknown:
            raise ConfigError(f"experiment: variant {label!r}: unknown keys {unknown}")
        seed_label = _seed_variant(variants, label)
        local = {**spec, **{k: v for k, v in own.items() if k not in ("config", "seeds_of")}}
        if own.get("base") and "algo" not in own:
            local.pop("algo", None)  # the variant's tuned example says its algorithm
        local["config"] = merge_dicts(spec.get("config") or {}, own.get("config") or {})
        for combination in itertools.product(*(axes[k] for k in keys)):
            values = dict(zip(keys, combination, strict=True))
            point = variant_name(values) if values else ""
            variant = ",".join(p for p in (label, point) if p) or "base"
            seeded = ",".join(p for p in (seed_label, point) if p) or "base"
            for k in range(seeds):
                seed = derive_seed(base_seed, seeded, k)
                run_name = f"{variant}-s{k}"
                algo, config = build(local, values, seed, root / run_name)
                runs.append(PlannedRun(run_name, variant, values, seed, algo, config))
    return Experiment(name, root, runs, spec)


def _seed_variant(variants: dict[str, Any], label: str) -> str:
    """The variant whose seeds ``label``'s runs take: its own, or the one its ``seeds_of``
    names (followed to a variant without one)."""
    seen = [label]
    while (other := variants[seen[-1]].get("seeds_of")) is not None:
        if other not in variants or other == "":
            known = ", ".join(repr(name) for name in variants if name)
            raise ConfigError(
                f"experiment: variant {seen[-1]!r}: seeds_of {other!r} is not a variant of the "
                f"file ({known})"
            )
        if other in seen:
            raise ConfigError(f"experiment: seeds_of goes round in a circle: {seen + [other]}")
        seen.append(other)
    return seen[-1]


MAX_RUNS = 10_000
"""The most runs one experiment file may plan: a larger grid is a typo (``seeds: 1e6``), and
planning builds every run's config."""


def _whole(value: Any, key: str) -> int:
    """An experiment file's whole-number entry, or a ConfigError naming it."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or value != int(value):
        raise ConfigError(f"experiment: {key} is a whole number, not {value!r}")
    return int(value)


def nested(values: dict[str, Any]) -> dict[str, Any]:
    """``{"optim.lr": x}`` -> ``{"optim": {"lr": x}}``."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        node = out
        *heads, last = key.split(".")
        for head in heads:
            node = node.setdefault(head, {})
        node[last] = value
    return out


def merge_dicts(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``extra`` over ``base``, nested blocks merged key by key."""
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_dicts(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def build(spec: dict[str, Any], values: dict[str, Any], seed: int, run_dir: Path):
    """The algorithm and full config dict of one run."""
    base = values.get("base", spec.get("base"))
    algo = values.get("algo", spec.get("algo"))
    if base is not None:
        example = find_tuned(str(base))
        if algo is not None and algo != example.algo:
            raise ConfigError(
                f"experiment: {example.name} configures {example.algo!r}, not {algo!r}"
            )
        algo, config = example.algo, example.build_config()
    elif algo is not None:
        config = get_algorithm(str(algo)).default_config()
    else:
        raise ConfigError("experiment: give a base (tuned example) or an algo, or vary one")
    spec_cls = get_algorithm(str(algo)).config_cls
    fields = {k: v for k, v in values.items() if k not in SPECIAL_AXES}
    overrides = merge_dicts(spec.get("config") or {}, nested(fields))  # a copy: not the file's
    run = dict(overrides.get("run") or {})
    run.update(seed=seed, run_dir=str(run_dir), console=False)
    overrides["run"] = run
    config = from_dict(spec_cls, overrides, path=f"experiment {spec['name']}", base=config)
    return str(algo), plain(config)


def plain(config: Any) -> dict[str, Any]:
    """A config as the plan stores it: JSON's types (tuples as lists)."""
    return json.loads(json.dumps(dataclasses.asdict(config), default=list))
