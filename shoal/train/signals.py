"""Stopping on a signal without losing work.

SIGINT is Ctrl-C; SIGTERM is what `kill`, `timeout`, a container's stop and a batch
scheduler's notice before its SIGKILL (Slurm, Kubernetes) send. A training run treats both
alike (`stop_signals`): the first lets the iteration under way finish, saves a checkpoint and
stops; a second aborts at once. A process that runs others (``shoal experiment``, ``shoal
tune``'s workers) passes SIGTERM on to them (`forward_sigterm`): Ctrl-C reaches them by
itself, since a terminal signals its whole foreground process group.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["SIGNAL_WORDS", "STOP_SIGNALS", "forward_sigterm", "stop_signals"]

STOP_SIGNALS = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated"}
"""The signals that stop a run between iterations, and the stop reason each gives."""
SIGNAL_WORDS = {"interrupted": "Ctrl-C", "terminated": "SIGTERM"}
"""Those stop reasons, and the signals' names for users."""


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextmanager
def stop_signals() -> Iterator[list[str]]:
    """The first Ctrl-C or SIGTERM puts its stop reason in the list the loop checks between
    iterations (so it can save a consistent checkpoint); a second one interrupts at once.
    Outside the main thread (where Python delivers no signals) the list stays empty."""
    signalled: list[str] = []
    if not _in_main_thread():
        yield signalled
        return

    def handler(signum: int, frame: Any) -> None:
        if signalled:
            raise KeyboardInterrupt
        reason = STOP_SIGNALS[signal.Signals(signum)]
        signalled.append(reason)
        word = SIGNAL_WORDS[reason]
        print(f"\n{word}: finishing this iteration and saving a checkpoint ({word} again to abort)")

    previous = {signum: signal.signal(signum, handler) for signum in STOP_SIGNALS}
    try:
        yield signalled
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


@contextmanager
def forward_sigterm(children: Callable[[], Iterable[Any]]) -> Iterator[None]:
    """While inside, SIGTERM to this process is sent on to each of ``children()`` (processes
    with ``terminate()``: `subprocess.Popen`, `multiprocessing.Process`), which save and exit,
    and then raises KeyboardInterrupt here, so this process stops as after Ctrl-C.
    Outside the main thread nothing changes."""
    if not _in_main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        for child in list(children()):
            child.terminate()  # SIGTERM on POSIX
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
