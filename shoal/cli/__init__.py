"""The ``shoal`` command line: train, eval, experiment, tune, report, export, collect, list.

Each command is a module of this package with the parser of its options and the function
that runs it: `train` (whose config fields go to tyro, not argparse), `evaluate`,
`studies` (experiment, tune, report), `artifacts` (export, collect) and `listing`.
``main`` dispatches and turns a `ShoalError` into one red line and exit code 2, a second
Ctrl-C into exit code 130.
"""

from __future__ import annotations

import argparse
import sys

from rich.markup import escape

from shoal.cli import artifacts, evaluate, listing, studies, train
from shoal.cli.shared import EXIT_ERROR, EXIT_INTERRUPTED, console
from shoal.core.errors import ShoalError

__all__ = ["console", "main"]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] == ["train"]:
            return train.run(argv[1:])
        args = _parser().parse_args(argv)
        return args.run(args)
    except ShoalError as exc:
        console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
        return EXIT_ERROR
    except KeyboardInterrupt:  # the second Ctrl-C: abort without saving
        # On a terminal the cursor stands after the echoed ^C: start a line of its own.
        console.print(("\n" if console.is_terminal else "") + "aborted", highlight=False)
        return EXIT_INTERRUPTED


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="shoal", description="Reinforcement learning on PyTorch.")
    parser.add_argument("--version", action="version", version=f"shoal {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    train.add_parser(commands)
    evaluate.add_parser(commands)
    studies.add_parsers(commands)
    artifacts.add_parsers(commands)
    listing.add_parser(commands)
    return parser


def _version() -> str:
    from shoal import __version__

    return __version__
