"""The test session's Ray workers forked from a process that has imported torch once.

Every Ray actor is a new worker process, and each one imports Ray, torch, gymnasium and shoal
before its first call: about 4 s of CPU on a laptop core, paid some 140 times over the tests
of ``tests/distributed``. Here the local Ray of the ``ray_session`` fixture starts its Python
workers through this file, in place of Ray's ``setup_worker.py``:

* ``python ray_zygote.py ARGS`` is what the raylet runs for a worker. Where the worker needs
  nothing of Ray's runtime environments (the tests' local Ray never does), it hands its
  command line, environment, working directory and standard streams to the zygote and waits:
  the zygote forks a child that runs Ray's ``default_worker.py`` with those arguments, as
  ``setup_worker.py`` would have exec'ed it, and this process exits with the child's status.
  A signal sent to it is passed on to the child; where it dies, the child is killed. Anything
  else (another language, a runtime environment, no zygote) goes to Ray's own
  ``setup_worker.py``.
* The zygote (``python ray_zygote.py --serve DIR``) is started by the first worker, so it has
  the environment the raylet gives its workers; it imports `PRELOAD` once and ends when the
  raylet does.

The child registers with the raylet under its own pid, which the raylet then uses to kill it
(``ray.kill``, restarts, shutdown): the tests' kills, restarts and collectives run on Ray as
they do with workers Ray starts itself. `use_zygote` (the ``ray_session`` fixture) points a
local Ray started inside it at this file.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import time

PRELOAD = (
    "numpy", "torch", "torch._dynamo", "gymnasium", "ray", "ray.util.collective",
    "shoal.api", "shoal.train.session", "shoal.distributed.ray_workers",
    "shoal.studies.fork_server",
)  # fmt: skip
"""What a test's Ray actor imports before its first call."""

DIR_VAR = "SHOAL_TEST_RAY_ZYGOTE"
"""The environment variable naming the zygote's directory (its socket, lock and log)."""

_REAL_SETUP = ("ray", "_private", "workers", "setup_worker.py")


def _real_setup_worker() -> str:
    import importlib.util

    spec = importlib.util.find_spec("ray")
    assert spec is not None and spec.origin is not None
    return os.path.join(os.path.dirname(os.path.dirname(spec.origin)), *_REAL_SETUP)


def _exec_ray_setup_worker() -> None:
    os.execv(sys.executable, [sys.executable, _real_setup_worker(), *sys.argv[1:]])


# The raylet's side: one per worker.


def _worker_args(argv: list[str]) -> list[str] | None:
    """``default_worker.py ARGS`` as ``setup_worker.py`` would run it, or None where it would
    do more (a runtime environment, another language)."""
    rest, context, language = [], "{}", None
    for arg in argv:
        if arg.startswith("--serialized-runtime-env-context="):
            context = arg.split("=", 1)[1]
        elif arg.startswith("--language="):
            language = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    fields = json.loads(context or "{}")
    plain = (
        not fields.get("command_prefix")
        and not fields.get("env_vars")
        and fields.get("py_executable") in (None, sys.executable)
        and not fields.get("override_worker_entrypoint")
    )
    if language != "PYTHON" or not plain or not rest or not rest[0].endswith(".py"):
        return None
    return rest


def _connect(path: str) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        return None
    return sock


def _zygote(directory: str) -> socket.socket | None:
    """A connection to this raylet's zygote, started here if none runs yet (one start at a
    time). Each raylet (a node of a cluster on this machine) has its own."""
    import fcntl
    import subprocess

    directory = os.path.join(directory, os.environ.get("RAY_RAYLET_PID", "0"))
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "sock")
    sock = _connect(path)
    if sock is not None:
        return sock
    with open(os.path.join(directory, "lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        sock = _connect(path)
        if sock is not None:
            return sock
        with open(os.path.join(directory, "log"), "ab") as log:
            server = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--serve", directory],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + 300
        while server.poll() is None and time.monotonic() < deadline:
            sock = _connect(path)
            if sock is not None:
                return sock
            time.sleep(0.05)
    return None


def client() -> None:
    args = _worker_args(sys.argv[1:])
    directory = os.environ.get(DIR_VAR)
    sock = _zygote(directory) if args is not None and directory else None
    if sock is None:
        _exec_ray_setup_worker()
        return
    request = json.dumps({"args": args, "env": dict(os.environ), "cwd": os.getcwd()})
    socket.send_fds(sock, [request.encode()], [0, 1, 2])
    reply = sock.recv(64)
    if not reply:
        os._exit(255)  # the zygote died before forking
    child = int(reply.decode())

    def pass_on(signum: int, frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(signum, pass_on)
    reply = sock.recv(64)  # (a signal passed on does not interrupt it: PEP 475)
    code = int(reply.decode()) if reply else 255
    if code < 0:  # ended by a signal: end by it too, as the exec'ed worker would have
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code)


# The zygote's side.


def _run_worker(args: list[str], environ: dict[str, str], cwd: str) -> int:
    """In the forked child: ``python default_worker.py ARGS``; the exit status."""
    import runpy

    from shoal.studies.fork_server import exit_status

    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(environ)
    sys.argv = list(args)
    sys.path[0] = os.path.dirname(os.path.abspath(args[0]))
    return exit_status(lambda: runpy.run_path(args[0], run_name="__main__"))


def serve(directory: str) -> None:
    import importlib
    import selectors

    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    raylet = int(os.environ.get("RAY_RAYLET_PID", "0"))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    path = os.path.join(directory, "sock")
    listener.bind(path + ".new")
    listener.listen(64)
    os.rename(path + ".new", path)  # (connectable only once listening)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "accept")
    selector.register(wake_read, selectors.EVENT_READ, "child")
    children: dict[int, socket.socket] = {}
    while True:
        for key, _ in selector.select(timeout=2.0):
            if key.data == "accept":
                conn, _ = listener.accept()
                message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
                request = json.loads(message.decode())
                pid = os.fork()
                if pid == 0:
                    os.setsid()  # its own process group, as the raylet starts a worker in
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    selector.close()
                    listener.close()
                    os.close(wake_read)
                    os.close(wake_write)
                    for other in children.values():
                        other.close()
                    conn.close()
                    for target, fd in enumerate(fds):
                        os.dup2(fd, target)
                        os.close(fd)
                    os._exit(_run_worker(request["args"], request["env"], request["cwd"]))
                for fd in fds:
                    os.close(fd)
                conn.sendall(str(pid).encode())
                children[pid] = conn
                selector.register(conn, selectors.EVENT_READ, pid)
            elif key.data == "child":
                os.read(wake_read, 4096)
                while True:
                    try:
                        pid, status = os.waitpid(-1, os.WNOHANG)
                    except ChildProcessError:
                        break
                    if pid == 0:
                        break
                    conn = children.pop(pid, None)
                    if conn is not None:
                        selector.unregister(conn)
                        with contextlib.suppress(OSError):
                            conn.sendall(str(os.waitstatus_to_exitcode(status)).encode())
                        conn.close()
            else:  # the worker's raylet-side process is gone: so is the worker
                with contextlib.suppress(ProcessLookupError):
                    os.kill(key.data, signal.SIGKILL)
                selector.unregister(key.fileobj)
        if raylet:
            try:
                os.kill(raylet, 0)
            except ProcessLookupError:
                return  # Ray shut down; its workers end on their own


def use_zygote(directory: str):
    """A context: a local Ray started inside it forks its Python workers from a zygote whose
    socket, lock and log are in ``directory``."""
    import contextlib

    import ray._private.services as services

    @contextlib.contextmanager
    def patched():
        original = services.start_raylet

        def start_raylet(*args, **kwargs):
            import inspect

            bound = inspect.signature(original).bind(*args, **kwargs)
            bound.arguments["setup_worker_path"] = os.path.abspath(__file__)
            return original(*bound.args, **bound.kwargs)

        services.start_raylet = start_raylet
        saved = os.environ.get(DIR_VAR)
        os.environ[DIR_VAR] = directory
        try:
            yield
        finally:
            services.start_raylet = original
            if saved is None:
                os.environ.pop(DIR_VAR, None)
            else:
                os.environ[DIR_VAR] = saved

    return patched()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        serve(sys.argv[2])
    else:
        client()
