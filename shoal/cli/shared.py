"""What the ``shoal`` commands share: the console they print to, their exit codes, the
``--trust-code`` option."""

from __future__ import annotations

import argparse

from rich.console import Console

EXIT_INTERRUPTED = 130  # the shell's code for a command stopped by Ctrl-C
EXIT_TERMINATED = 143  # and by SIGTERM (128 + 15)
# A run stopped by a signal saves and exits with the shell's code for that signal.
STOP_EXIT_CODES = {"interrupted": EXIT_INTERRUPTED, "terminated": EXIT_TERMINATED}
EXIT_ERROR = 2  # a ShoalError: bad input, said in one line

console = Console(soft_wrap=True)  # never break paths across lines


def plain(text: str) -> None:
    """``text`` as it is: no markup, no highlighting."""
    console.print(text, highlight=False, markup=False)


def add_trust_code(parser: argparse.ArgumentParser) -> None:
    """The option that lets a command import the user modules a run records (a run
    directory's files are never executed without it: `shoal.train.checkpoint`)."""
    parser.add_argument(
        "--trust-code",
        action="store_true",
        help="import users' modules from the directories the run records (only for runs whose "
        "code you trust; without it, only installed packages and the working directory)",
    )
