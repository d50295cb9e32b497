"""``shoal`` commands started by fork from a process that has imported torch once: what
`shoal.experiment` starts its runs with on this machine.

A run as its own ``python -m shoal.cli train`` pays about 3 s of imports before its first step
on a laptop core (torch, and torch's compiler stack, which every torch optimizer loads), and an
experiment of many short runs pays it for each. `ForkServer` starts one such process (``python
-m shoal.studies.fork_server``), which imports them once and then forks a child per command:
the child takes the caller's environment, working directory and a log for its output, and runs
``shoal ARGS`` as ``python -m shoal.cli ARGS`` would (the working directory first on
``sys.path``, the same exit statuses: 2 for bad input, 130 after Ctrl-C, -15 when SIGTERM ended
it). The server ignores Ctrl-C, which reaches the runs (they share the terminal's process
group, as subprocesses do), and it ends when its caller closes the connection.

Nothing of the caller is imported in the server or its children (multiprocessing's
forkserver and spawn would import the caller's ``__main__`` script again). Where ``os.fork``
is missing (Windows), `start_command` starts a subprocess instead.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import traceback
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

PRELOAD = ("numpy", "torch", "torch._dynamo", "gymnasium", "shoal.api", "shoal.train.session")
"""What the server imports once: what every run imports before its first step. Not the
command line (``shoal.cli``): its console reads whether output is a terminal when imported."""


class ForkedCommand:
    """One command forked by the server; ``poll``, ``wait``, ``terminate`` and ``returncode``
    as `subprocess.Popen`'s."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._ended = threading.Event()

    def _exited(self, code: int) -> None:
        self.returncode = code
        self._ended.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """The server process and the connection to it. `start` sends a command and returns its
    `ForkedCommand`; a thread here takes the server's reports of the commands' exits. If the
    server dies, its commands' ``returncode`` is 255 (as multiprocessing reports a lost
    child) and the next `start` starts a new server."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "shoal.studies.fork_server", str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
        )
        theirs.close()
        self.connection = Connection(ours.detach())
        self._started: queue.Queue[ForkedCommand | BaseException] = queue.Queue()
        self._commands: dict[int, ForkedCommand] = {}  # (only the reports' thread uses it)
        self._send = threading.Lock()
        self.alive = True
        threading.Thread(target=self._reports, daemon=True).start()

    def start(
        self, argv: list[str], log: Path, environ: dict[str, str] | None = None,
        cwd: str | Path | None = None,
    ) -> ForkedCommand:  # fmt: skip
        """``shoal ARGS`` forked by the server, its output appended to ``log``, with this
        process's environment and working directory (or ``environ`` and ``cwd``)."""
        environ = dict(os.environ) if environ is None else dict(environ)
        cwd = os.path.abspath(cwd if cwd is not None else os.getcwd())
        with self._send:
            where = (list(argv), str(Path(log).absolute()), environ, cwd)
            self.connection.send(where)
            reply = self._started.get()
        if isinstance(reply, BaseException):
            raise reply
        return reply

    def _reports(self) -> None:
        """The server's reports, in order: a command's start always before its exit."""
        try:
            while True:
                kind, pid, *code = self.connection.recv()
                if kind == "started":
                    self._commands[pid] = ForkedCommand(pid)
                    self._started.put(self._commands[pid])
                else:
                    self._commands.pop(pid)._exited(code[0])
        except (EOFError, OSError):
            self.alive = False
            self._started.put(RuntimeError("the fork server of shoal's runs stopped"))
            for command in self._commands.values():
                command._exited(255)

    def close(self) -> None:
        """Ends the server (commands running go on, as subprocesses would)."""
        self.alive = False
        with contextlib.suppress(OSError):
            self.connection.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)


_SERVER: ForkServer | None = None
_SERVER_LOCK = threading.Lock()


def start_command(
    argv: list[str], log: Path, environ: dict[str, str] | None = None,
    cwd: str | Path | None = None,
) -> Any:  # fmt: skip
    """``shoal ARGS`` with its output appended to ``log``: forked by this process's fork
    server (started on first use), or a subprocess where ``os.fork`` is missing. It runs with
    this process's environment and working directory, or ``environ`` and ``cwd``."""
    global _SERVER
    if not hasattr(os, "fork"):
        with Path(log).open("ab") as handle:
            return subprocess.Popen(
                [sys.executable, "-m", "shoal.cli", *argv], stdout=handle,
                stderr=subprocess.STDOUT, env=environ, cwd=cwd,
            )  # fmt: skip
    with _SERVER_LOCK:
        if _SERVER is None or not _SERVER.alive:
            _SERVER = ForkServer()
            atexit.register(_SERVER.close)
        server = _SERVER
    return server.start(argv, log, environ, cwd)


# The server's side.


def _python_path(environ: dict[str, str] | os._Environ[str]) -> list[str]:
    return [os.path.abspath(p) for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p]


def _run(argv: list[str], log: str, environ: dict[str, str], cwd: str) -> int:
    """In the forked child: ``python -m shoal.cli ARGS`` with output to ``log``; the exit
    status."""
    os.chdir(cwd)  # (``log`` is absolute; relative paths in ``argv`` are the caller's)
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    # sys.path as a fresh ``python -m`` would set it: the working directory, then the
    # caller's PYTHONPATH (not the server's), then the rest.
    own = _python_path(os.environ)
    sys.path[:] = [cwd, *_python_path(environ), *(p for p in sys.path[1:] if p not in own)]
    os.environ.clear()
    os.environ.update(environ)
    sys.argv = ["shoal", *argv]  # (runpy puts the module's path first, as ``-m`` does)
    import runpy

    return exit_status(lambda: runpy.run_module("shoal.cli", run_name="__main__", alter_sys=True))


def exit_status(main: Any) -> int:
    """``main()`` run as a script's ``__main__`` ends in a forked child: its exit status (that
    of ``sys.exit``, 130 after Ctrl-C, 1 after a traceback), the ``atexit`` functions run and
    the streams flushed, ready for ``os._exit``."""
    code: int
    try:
        main()
        code = 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        code = 130
    except BaseException:
        traceback.print_exc()
        code = 1
    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    return code


def serve(fd: int) -> None:
    """The server: imports `PRELOAD`, then forks a child per command received on ``fd`` and
    reports each child's start and exit status, until the caller closes ``fd``."""
    with contextlib.suppress(EOFError, OSError):  # the caller closed the connection
        _serve(Connection(fd))


def _serve(connection: Connection) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the runs' to act on
    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    while True:
        ready = wait([connection, wake_read])
        if wake_read in ready:
            os.read(wake_read, 4096)
            while True:
                try:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    break
                connection.send(("exited", pid, os.waitstatus_to_exitcode(status)))
        if connection in ready:
            argv, log, environ, cwd = connection.recv()
            pid = os.fork()
            if pid == 0:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.default_int_handler)
                connection.close()
                os.close(wake_read)
                os.close(wake_write)
                os._exit(_run(argv, log, environ, cwd))
            connection.send(("started", pid))


if __name__ == "__main__":
    serve(int(sys.argv[1]))
