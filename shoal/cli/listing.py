"""``shoal list``: the algorithms, tuned examples, environment ids and dataset recipes."""

from __future__ import annotations

import argparse
import textwrap
from typing import Any

from rich.markup import escape
from rich.table import Column, Table

from shoal.cli.shared import console


def add_parser(commands: Any) -> None:
    list_p = commands.add_parser("list", help="algorithms and tuned examples")
    list_p.add_argument(
        "--envs", action="store_true", help="environment ids that work here, grouped"
    )
    list_p.add_argument("--long", action="store_true", help="full descriptions")
    list_p.add_argument(
        "--datasets", action="store_true", help="dataset recipes (shoal collect --recipe NAME)"
    )
    list_p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.envs:
        return _list_envs()
    if args.datasets:
        return _list_datasets()
    from shoal.registry import ALGORITHMS, tuned_examples

    specs = list(ALGORITHMS.values())
    tuned = tuned_examples()
    env_ids = {
        n: e.config.get("env", {}).get("id", "") or e.config.get("dataset", "")
        for n, e in tuned.items()
    }
    if args.long:  # descriptions as indented paragraphs: readable at any width
        console.print("[bold]algorithms[/]", highlight=False)
        for spec in specs:
            _paragraph(f"{spec.name} ({spec.action_spaces})", spec.summary)
        console.print("\n[bold]tuned examples[/]", highlight=False)
        for example_name, example in tuned.items():
            _paragraph(
                f"{example_name}: {example.algo} on {env_ids[example_name]}", example.expected
            )
        return 0

    # Names never wrap or truncate (they are what users type next), nor do the action spaces;
    # the descriptions are cut with an ellipsis at the terminal's width (--long has them).
    def name(header: str, values: list[str]) -> Column:
        return Column(header, no_wrap=True, min_width=max(map(len, [header, *values])))

    def text(header: str) -> Column:
        return Column(header, no_wrap=True, overflow="ellipsis", ratio=1)

    def one_line(value: str) -> str:
        return " ".join(value.split())

    algos = Table(
        name("algorithm", [s.name for s in specs]),
        Column("actions", ratio=1, overflow="fold"),  # wrapped, never cut: what a learner takes
        text("what"),
        title="algorithms",
        expand=True,
    )
    for spec in specs:
        algos.add_row(spec.name, one_line(spec.action_spaces), one_line(spec.summary))
    console.print(algos)
    examples = Table(
        name("tuned example", list(tuned)),
        name("algorithm", [e.algo for e in tuned.values()]),
        text("env"),
        title="tuned examples",
        expand=True,
    )
    for example_name, example in tuned.items():
        examples.add_row(example_name, example.algo, env_ids[example_name])
    console.print(examples)
    console.print(
        "shoal list --long: with descriptions; shoal list --envs: environment ids",
        highlight=False,
    )
    return 0


def _paragraph(title: str, text: str) -> None:
    """``title`` in bold, then ``text`` as one paragraph indented under it, filled to the
    terminal's width."""
    console.print(f"  [bold]{escape(title)}[/]", highlight=False)
    width = max(console.width, 40)
    body = textwrap.fill(
        " ".join(text.split()), width, initial_indent="      ", subsequent_indent="      "
    )
    console.print(escape(body), highlight=False)


def _list_datasets() -> int:
    from shoal.studies.datasets import RECIPES

    table = Table(Column("recipe", no_wrap=True), "source run", "taken at", "minutes",
                  title="dataset recipes")  # fmt: skip
    for recipe in RECIPES.values():
        what = "its replay" if recipe.from_replay else f"{recipe.episodes} episodes"
        table.add_row(recipe.name, f"{recipe.source.tuned} ({recipe.source.name})",
                      f"step {recipe.step:,}: {what}", recipe.source.minutes)  # fmt: skip
    console.print(table)
    console.print("shoal collect --recipe NAME writes datasets/NAME", highlight=False)
    return 0


def _list_envs() -> int:
    from shoal.envs.catalog import catalog

    found = catalog()
    width = max(console.width, 40)
    for group in found.groups:
        console.print(f"[bold]{escape(group.title)}[/]", highlight=False)
        if group.note:
            console.print(f"  {escape(group.note)}", highlight=False)
        line = " "
        for env_id in group.ids:  # ids packed into lines, never cut
            if len(line) + 1 + len(env_id) > width and line.strip():
                console.print(escape(line), highlight=False)
                line = " "
            line += " " + env_id
        if line.strip():
            console.print(escape(line), highlight=False)
    if found.unavailable:
        console.print("[bold]registered but not usable here[/]", highlight=False)
        for env_id, reason in found.unavailable:
            console.print(f"  {escape(env_id)}: {escape(reason)}", highlight=False)
    return 0
