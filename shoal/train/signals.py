"""Stopping on a signal without losing work.

SIGINT is Ctrl-C; SIGTERM is what `kill`, `timeout`, a container's stop and a batch
scheduler's notice before its SIGKILL (Slurm, Kubernetes) send. A training run
(`stop_signals`) lets the iteration under way finish and saves a checkpoint on the first of
either; a second one aborts at once. Ctrl-C then ends the run (``shoal.train`` returns, stop
reason "interrupted"). SIGTERM is only put off: once the run is saved and closed,
`deliver_deferred` sends it again to the process, under the handler the process had before, so
a process asked to terminate terminates (by default), now with its work saved. A signal the
process ignored before (SIG_IGN, as a shell sets SIGINT for background jobs) stays ignored.
A process that runs others (``shoal experiment``, ``shoal tune``'s workers) passes SIGTERM on
to them (`forward_sigterm`): Ctrl-C reaches them by itself, since a terminal signals its whole
foreground process group.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["SIGNAL_WORDS", "STOP_SIGNALS", "deliver_deferred", "forward_sigterm", "stop_signals"]

STOP_SIGNALS = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated"}
"""The signals that stop a run between iterations, and the stop reason each gives."""
SIGNAL_WORDS = {"interrupted": "Ctrl-C", "terminated": "SIGTERM"}
"""Those stop reasons, and the signals' names for users."""


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _restorable(handler: Any) -> Any:
    """A handler that `signal.getsignal` returned, as `signal.signal` takes it back: None
    (one installed outside Python) comes back as the default."""
    return signal.SIG_DFL if handler is None else handler


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

    watched = [n for n in STOP_SIGNALS if signal.getsignal(n) is not signal.SIG_IGN]
    previous = {signum: signal.signal(signum, handler) for signum in watched}
    try:
        yield signalled
    finally:
        for signum, old in previous.items():
            signal.signal(signum, _restorable(old))


def deliver_deferred(reason: str, saved: Path | None) -> None:
    """After `stop_signals` has exited (its handlers restored) and the run, stopped for
    ``reason``, is saved in ``saved`` and closed: a SIGTERM that stopped it is sent to this
    process again, for the process's own handler to act on (by default: terminate). A Ctrl-C
    has done its work (the run stopped) and is not sent again."""
    if reason != "terminated":
        return
    run = saved.parent.parent if saved is not None else None  # run/checkpoints/step_N
    resume = f" (resume: shoal train --resume {run})" if run is not None else ""
    print(f"SIGTERM: the run is saved in {saved}; terminating{resume}", flush=True)
    signal.raise_signal(signal.SIGTERM)


@contextmanager
def forward_sigterm(children: Callable[[], Iterable[Any]]) -> Iterator[None]:
    """While inside, SIGTERM to this process is sent on to each of ``children()`` (processes
    with ``terminate()``: `subprocess.Popen`, `multiprocessing.Process`), which save and exit,
    and then raises KeyboardInterrupt here, so this process stops as after Ctrl-C.
    Outside the main thread, or where this process ignores SIGTERM, nothing changes."""
    if not _in_main_thread() or signal.getsignal(signal.SIGTERM) is signal.SIG_IGN:
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
        signal.signal(signal.SIGTERM, _restorable(previous))
