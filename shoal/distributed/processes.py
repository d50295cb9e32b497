"""A learner group's ranks as processes on this machine, without Ray (``run.learner_processes``).

A learner group (`shoal.algos.cores.learner_group`) asks of Ray a pool of workers called in
lockstep, killed and rebuilt as a whole; this module answers that slice of
`shoal.distributed.ray_workers` (``connect``, ``gpu_share``, ``available_cpus``, ``put``,
``node_ip``, ``WorkerPool``) with fresh Python processes (``python -m
shoal.distributed.processes``: not forked, as this process already runs threads, torch's
and a sampler's; not multiprocessing's spawn, which would run the user's script again).
Each worker answers ``(method, args)`` requests over a local authenticated connection, in
order, with one torch thread; a worker that dies closes its pipe and
the call in flight fails with `WorkerFailed` naming it, which restarts the group from its
synchronized state as on Ray. Arguments and results are pickled copies, as Ray's are.

Without Ray, a learner group needs nothing but this machine: no cluster and no placement
groups (``run.ray_address`` still places the runners, if any). On 2 cores its updates took
what a group of Ray actors' take (`benchmarks/learners.py`: 1,829 against 1,885 and 1,827
against 1,837 ms per update in two runs).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import secrets
import subprocess
import sys
from multiprocessing.connection import Client, Connection, Listener, wait
from typing import Any

import torch

from shoal.core.errors import DistributedError


class WorkerFailed(DistributedError):
    """A worker of a pool called in lockstep failed (`shoal.distributed.ray_workers`'s)."""


def _send(conn: Connection, value: Any) -> None:
    """``value`` pickled: a copy (a `Connection`'s own ``send`` would put torch tensors in
    shared memory, which both processes would then write)."""
    conn.send_bytes(pickle.dumps(value))


def _receive(conn: Connection) -> Any:
    return pickle.loads(conn.recv_bytes())


def _serve(conn: Connection, payload: tuple | None = None) -> None:
    """A worker: its environment (its GPU), one torch thread, ``cls(*args)`` as the pool sent
    them (a forked worker has them as ``payload``), then ``(method, args)`` requests answered
    in order until None or EOF."""
    environment, cls, args = _receive(conn) if payload is None else payload
    os.environ.update(environment)
    torch.set_num_threads(1)
    worker = cls(*args)
    _send(conn, ("ok", None))
    while True:
        try:
            request = _receive(conn)
        except EOFError:
            return
        if request is None:
            return
        method, call_args = request
        try:
            reply: tuple[str, Any] = ("ok", getattr(worker, method)(*call_args))
        except BaseException as exc:  # noqa: BLE001 (handed to the caller, as Ray does)
            reply = ("error", f"{type(exc).__name__}: {exc}")
        _send(conn, reply)


def main() -> None:
    """A worker process's entry point: ``python -m shoal.distributed.processes HOST PORT``,
    the pool's authentication key on stdin."""
    host, port = sys.argv[1], int(sys.argv[2])
    key = bytes.fromhex(sys.stdin.readline().strip())
    with Client((host, port), authkey=key) as conn:
        _serve(conn)


class WorkerPool:
    """``num_workers`` processes of ``cls(*make_args(i))`` (the module doc); ``num_gpus`` > 0
    gives worker ``i`` GPU ``i`` mod the machine's count (``CUDA_VISIBLE_DEVICES``)."""

    def __init__(self, cls: type, make_args: Any, num_workers: int, name: str = "worker",
                 num_gpus: float = 0.0, fork: bool = False, **_: Any):  # fmt: skip
        """``fork``: fork the workers from this process instead (they start with everything
        it imported; for tests, whose process runs no threads that a fork would break)."""
        self.name = name
        self.conns: list[Connection] = []
        self.processes: list[Any] = []
        """`subprocess.Popen` or, forked, `multiprocessing.Process` objects."""
        devices = torch.cuda.device_count() if num_gpus else 0
        with contextlib.ExitStack() as stack:
            start = self._fork if fork else self._fresh(stack)
            for i in range(num_workers):
                environment = {"CUDA_VISIBLE_DEVICES": str(i % devices)} if devices else {}
                process, conn = start((environment, cls, make_args(i)))
                self.conns.append(conn)
                self.processes.append(process)
        for i in range(num_workers):  # built: their learners exist
            self._receive(i, "__init__")

    @staticmethod
    def _fork(payload: tuple) -> tuple[Any, Connection]:
        """A forked worker, handed ``payload`` in memory (as it is: nothing pickled)."""
        context = multiprocessing.get_context("fork")
        ours, theirs = context.Pipe()
        process = context.Process(target=_serve, args=(theirs, payload), daemon=True)
        process.start()
        theirs.close()
        return process, ours

    @staticmethod
    def _fresh(stack: contextlib.ExitStack) -> Any:
        """Starts a fresh interpreter per worker (not fork: this process runs threads; not
        multiprocessing's spawn, which would run the user's script again), connected back
        through ``stack``'s listener."""
        key = secrets.token_bytes(32)
        listener = stack.enter_context(Listener(("127.0.0.1", 0), authkey=key))
        host, port = listener.address
        command = [sys.executable, "-m", "shoal.distributed.processes", host, str(port)]
        threads = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # as Ray's actors

        def start(payload: tuple) -> tuple[Any, Connection]:
            process = subprocess.Popen(command, stdin=subprocess.PIPE, text=True,
                                       env={**os.environ, **threads})  # fmt: skip
            assert process.stdin is not None
            process.stdin.write(key.hex() + "\n")
            process.stdin.close()
            conn = listener.accept()
            _send(conn, payload)
            return process, conn

        return start

    def __len__(self) -> int:
        return len(self.processes)

    def _failed(self, i: int, method: str, why: str) -> WorkerFailed:
        return WorkerFailed(f"{self.name} {i} failed during {method} ({why})")

    def _send(self, i: int, method: str, args: tuple) -> None:
        try:
            _send(self.conns[i], (method, args))
        except (BrokenPipeError, ConnectionError, OSError) as exc:
            raise self._failed(i, method, type(exc).__name__) from exc

    def _receive(self, i: int, method: str) -> Any:
        try:
            status, value = _receive(self.conns[i])
        except (EOFError, ConnectionError, OSError) as exc:
            raise self._failed(i, method, "its process died") from exc
        if status == "error":
            raise self._failed(i, method, value)
        return value

    def call_one(self, i: int, method: str, *args: Any) -> Any:
        self._send(i, method, args)
        return self._receive(i, method)

    def lockstep(self, method: str, *args: Any) -> list[Any]:
        """``method`` on every worker at once; results in worker order; the first worker
        to fail (a raised error, a closed pipe) fails the call at once, naming it."""
        for i in range(len(self)):
            self._send(i, method, args)
        results: list[Any] = [None] * len(self)
        pending = {conn: i for i, conn in enumerate(self.conns)}
        while pending:
            for conn in wait(list(pending)):
                i = pending.pop(conn)  # type: ignore[call-overload]
                results[i] = self._receive(i, method)
        return results

    def call_all(self, method: str, *args: Any) -> list[Any]:
        return self.lockstep(method, *args)

    def kill(self, i: int) -> None:
        """Kill worker ``i``'s process, as a crash would (for tests of recovery)."""
        self.processes[i].kill()
        _wait(self.processes[i])

    def placement_nodes(self) -> list[str]:
        return ["this machine"] * len(self)

    def close(self) -> None:
        """Stop every worker (one waiting in a collective for a dead one is killed)."""
        for conn in self.conns:
            with contextlib.suppress(BrokenPipeError, ConnectionError, OSError):
                _send(conn, None)
        for process in self.processes:
            if not _wait(process, timeout=5):
                process.kill()
                _wait(process)
        for conn in self.conns:
            conn.close()


def _wait(process: Any, timeout: float | None = None) -> bool:
    """Wait for a worker's process to end; whether it did within ``timeout``."""
    if isinstance(process, subprocess.Popen):
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        return True
    process.join(timeout=timeout)
    return not process.is_alive()


def connect(address: str | None = None, num_cpus: int | None = None) -> None:
    """Nothing to connect to: the workers are this machine's processes."""


def gpu_share(device: str, learners: int) -> float:
    """Each learner's share of this machine's GPUs where ``device`` asks for CUDA (1: a GPU
    of its own), else 0."""
    if torch.device(device if device != "auto" else "cpu").type != "cuda":
        return 0.0
    return min(1.0, torch.cuda.device_count() / learners)


def available_cpus() -> float:
    return float(os.cpu_count() or 1)


def put(value: Any) -> Any:
    """A copy, as Ray's object store holds one: a replay's batches are views of buffers its
    next sample overwrites, and a rebuilt group learns the kept ones again."""
    return pickle.loads(pickle.dumps(value))


def node_ip() -> str:
    return "127.0.0.1"


if __name__ == "__main__":
    main()
