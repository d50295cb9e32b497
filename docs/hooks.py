"""MkDocs hooks: the parts of the pages that come from the code, so they cannot drift from it.

A page asks for a generated part with an HTML comment on a line of its own:

- ``<!-- shoal:algorithms -->``: every registered algorithm name with its one-line summary,
  its action spaces and its family's page (from `shoal.registry.ALGORITHMS`);
- ``<!-- shoal:algorithm NAME [NAME ...] -->``: the first name's paper (its module
  docstring's first paragraph), its action spaces, its config's fields (each with its type,
  its default under that name and its docstring; the blocks every algorithm shares, ``run``,
  ``env``, ..., link to the config reference) and every name's tuned examples; each name
  gets an anchor;
- ``<!-- shoal:block CLASS -->``: the fields of one shared block of `shoal.config` (the
  config reference page);
- ``<!-- shoal:tuned NAME -->``: the tuned examples of algorithm ``NAME``, each with what it
  trains and its measured result (the YAML's ``description`` and ``expected``);
- ``<!-- shoal:benchmarks -->``: ``benchmarks/README.md``, its result images copied beside;
- ``<!-- shoal:scaling -->``: which algorithm takes Ray runners, samples ahead of learning
  and runs several learners, with the setting of each (`AlgorithmSpec.scaling`).

A config field without a docstring, an unknown name and a family page an algorithm lacks are
warnings, which ``mkdocs build --strict`` (``make docs``) turns into errors.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

from mkdocs.plugins import get_plugin_logger
from mkdocs.structure.files import File

log = get_plugin_logger(__name__)

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^<!-- shoal:(\w+)(?: ([^>]*?))? -->$", re.MULTILINE)

FAMILIES = {
    "policy-gradient": ("pg", "a2c", "a3c", "ppo", "appo", "trpo", "impala", "ddppo"),
    "value-based": ("dqn", "qrdqn", "rem", "apex-dqn", "q-learning", "sarsa", "expected-sarsa",
                    "sarsa-lambda", "q-lambda", "tabular"),
    "off-policy-corrections": ("acer", "acktr", "r2d2", "apex-r2d2"),
    "continuous-control": ("ddpg", "td3", "sac", "d4pg", "apex-ddpg"),
    "multi-agent": ("mappo", "ippo", "maddpg", "maddpg-distributed", "qmix", "vdn", "iql",
                    "ctedd"),
    "evolution": ("es", "ars", "ga", "cmaes"),
    "search": ("mcts", "alphazero", "muzero"),
    "offline": ("bc", "cql", "iql-offline", "td3-bc"),
}  # fmt: skip
"""Each algorithm name's page under ``docs/algorithms/``."""

_griffe: Any = None


def _docstrings(cls: type) -> dict[str, str]:
    """The attribute docstrings of ``cls`` and its bases (read from the source by griffe)."""
    global _griffe
    import griffe

    if _griffe is None:
        _griffe = griffe.load(
            "shoal", search_paths=[str(ROOT)], resolve_aliases=False
        )
    found: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not klass.__module__.startswith("shoal"):
            continue
        try:
            node = _griffe[
                f"{klass.__module__.removeprefix('shoal.')}.{klass.__qualname__}"
            ]
        except KeyError:
            continue
        for name, member in node.members.items():
            if member.docstring is not None:
                found[name] = member.docstring.value
    return found


def _default(value: Any) -> str:
    text = repr(value)
    return f"`{text}`" if len(text) < 60 else "`...`"


SHARED_BLOCKS = ("RunConfig", "EnvConfig", "OptimConfig", "ModelConfig", "ReplayConfig",
                 "NoiseConfig", "SelfPlayConfig")  # fmt: skip
"""The blocks of `shoal.config` that the config reference page documents."""


def _section_of(cls: type) -> str | None:
    """The algorithm page section whose config is ``cls`` (a variant's base block)."""
    registry = _registry()
    page = {
        name: family for family, names in FAMILIES.items() for name in names
    }
    for name, spec in registry.ALGORITHMS.items():
        if spec.config_cls is cls and not spec.defaults and name in page:
            return f"{page[name]}.md#{name}"
    return None


def _indent(text: str, by: int) -> str:
    return "\n".join(
        " " * by + line if line else "" for line in text.splitlines()
    )


def _fields(
    cls: type,
    instance: Any,
    where: str,
    page: str,
    skip: frozenset[str] = frozenset(),
) -> str:
    """``cls``'s fields as a definition list (``page``: "algorithm" or "config", where the
    links point from), without those in ``skip``; a nested block links to its own
    documentation, or lists its fields."""
    docs = _docstrings(cls)
    lines = []
    for field in dataclasses.fields(cls):
        if field.name.startswith("_") or field.name in skip:
            continue
        value = getattr(instance, field.name)
        doc = (docs.get(field.name) or "").strip()
        block = type(value) if dataclasses.is_dataclass(value) else None
        if block is None and not doc:
            log.warning(
                f"{where}: config field {cls.__name__}.{field.name} has no docstring"
            )
        if block is None:
            kind = (
                field.type
                if isinstance(field.type, str)
                else field.type.__name__
            )
            head = f"`{field.name}` · `{kind}` · default {_default(value)}"
            lines.append(f"{head}\n:   {_indent(doc, 4).lstrip()}\n")
            continue
        prefix = "../" if page == "algorithm" else "algorithms/"
        section = _section_of(block)
        if block.__name__ in SHARED_BLOCKS:
            target = "../config.md" if page == "algorithm" else ""
            link = f"[`{block.__name__}`]({target}#{block.__name__.lower()})"
            inner = ""
        elif section is not None:
            link = f"[`{block.__name__}`]({prefix}{section})"
            inner = ""
        else:
            link = f"`{block.__name__}`"
            inner = _fields(block, value, where, page)
        text = doc or (block.__doc__ or "").strip().split("\n\n")[0]
        body = _indent(text, 4).lstrip() if text else "A block of its own:"
        entry = f"`{field.name}` · {link}\n:   {body}\n"
        if inner:
            entry += "\n" + _indent(inner, 4) + "\n"
        lines.append(entry)
    return "\n".join(lines)


def _registry():
    from shoal import registry

    return registry


def render_algorithms() -> str:
    registry = _registry()
    page = {
        name: family for family, names in FAMILIES.items() for name in names
    }
    rows = ["| name | what it is | action spaces | page |", "|---|---|---|---|"]
    for name, spec in registry.ALGORITHMS.items():
        family = page.get(name)
        if family is None:
            log.warning(
                f"algorithm {name!r} has no family page (docs/hooks.py FAMILIES)"
            )
            continue
        title = family.replace("-", " ")
        rows.append(
            f"| `{name}` | {spec.summary} | {spec.action_spaces} | [{title}]({family}.md#{name}) |"
        )
    return "\n".join(rows)


def render_scaling() -> str:
    """Which algorithm samples on Ray runners, samples ahead of learning and runs several
    learners, each with the setting that does it (`AlgorithmSpec.scaling`)."""
    registry = _registry()
    rows = [
        "| name | Ray runners | sampling ahead | several learners |",
        "|---|---|---|---|",
    ]
    for name, spec in sorted(registry.ALGORITHMS.items()):
        cells = [f"`{v}`" if v else "no" for v in spec.scaling().values()]
        rows.append(f"| `{name}` | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def render_algorithm(names: list[str]) -> str:
    import importlib

    registry = _registry()
    specs = [registry.ALGORITHMS.get(name) for name in names]
    if not names or None in specs:
        log.warning(f"shoal:algorithm names an unknown algorithm: {names}")
        return ""
    spec, name = specs[0], names[0]
    instance = spec.default_config()
    paper = (
        importlib.import_module(spec.config_cls.__module__).__doc__ or ""
    ).strip()
    paper = paper.split("\n\n")[0]
    from shoal.config.usage import unused

    ignored = unused(instance)  # listed apart: refused when set
    top = frozenset(path for path in ignored if "." not in path)
    fields = _fields(
        spec.config_cls, instance, name, page="algorithm", skip=top
    )
    if ignored:
        each = "; ".join(f"`{path}` ({why})" for path, why in ignored.items())
        fields += (
            f"\n\nNot read by {name}, and refused when set to another value than "
            f"its default: {each}.\n"
        )
    title = f"Config: {spec.config_cls.__name__}"
    if spec.defaults:
        settings = ", ".join(f"{k}={v!r}" for k, v in spec.defaults.items())
        title += f", with {settings} under the name {name}"
    indented = "\n".join(
        "    " + line if line else "" for line in fields.splitlines()
    )
    anchors = "".join(f'<a id="{n}"></a>' for n in names[1:])
    tuned = "\n".join(render_tuned(n) for n in names)
    return (
        f"{anchors}\n\n{paper}\n\nAction spaces: {spec.action_spaces}.\n\n"
        f'??? info "{title}"\n\n    Module `{spec.config_cls.__module__}`.\n\n{indented}\n\n'
        f"**Tuned examples** (`shoal train --tuned NAME`; `shoal list` lists them all)\n\n"
        f"{tuned}\n"
    )


def render_block(name: str) -> str:
    from shoal import config

    cls = getattr(config, name, None)
    if cls is None or not dataclasses.is_dataclass(cls):
        log.warning(f"shoal:block names no config block: {name!r}")
        return ""
    return _fields(cls, cls(), name, page="config")


def render_tuned(name: str) -> str:
    """Algorithm ``name``'s tuned examples, the smallest tasks first (fewest total steps),
    each a collapsed box: what it trains and what was measured on it."""
    registry = _registry()
    examples = {
        k: v for k, v in registry.tuned_examples().items() if v.algo == name
    }

    def budget(item: tuple[str, Any]) -> tuple[float, str]:
        steps = (item[1].config.get("run") or {}).get("total_steps")
        return (float(steps) if steps else float("inf"), item[0])

    out = []
    for key, example in sorted(examples.items(), key=budget):
        env = (example.config.get("env") or {}).get("id") or example.config.get(
            "dataset", ""
        )
        title = f"{key}: {env}" if env else key
        text = example.description.strip()
        if example.expected.strip():
            text += f"\n\n*Measured:* {example.expected.strip()}"
        out.append(f'??? example "{title}"\n\n{_indent(text, 4)}\n')
    return "\n".join(out)


def render_benchmarks() -> str:
    text = (ROOT / "benchmarks" / "README.md").read_text()
    text = (
        text.split("\n", 1)[1] if text.startswith("# ") else text
    )  # (the page has its title)
    return text.replace("](results/", "](benchmark-results/")


def on_files(files, config):
    """The benchmark result images, beside the benchmarks page."""
    for image in sorted((ROOT / "benchmarks" / "results").glob("*.png")):
        files.append(
            File.generated(
                config,
                f"benchmark-results/{image.name}",
                abs_src_path=str(image),
            )
        )
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    def expand(match: re.Match) -> str:
        kind, arg = match.group(1), (match.group(2) or "").strip()
        where = page.file.src_uri
        if kind == "algorithms":
            return render_algorithms()
        if kind == "algorithm":
            return render_algorithm(arg.split())
        if kind == "block":
            return render_block(arg)
        if kind == "tuned":
            return render_tuned(arg)
        if kind == "benchmarks":
            return render_benchmarks()
        if kind == "scaling":
            return render_scaling()
        log.warning(f"{where}: unknown generated part shoal:{kind}")
        return ""

    return MARKER.sub(expand, markdown)
