"""A learner group's ranks as processes forked from the test, not Ray actors.

A learner group (`shoal.algos.cores.learner_group`) needs processes of its own: its ranks
join a torch.distributed process group and all-reduce their gradients. What it asks of Ray is
a pool of such workers called in lockstep, one at a time, killed and rebuilt: `ForkedRay`
answers that slice of `shoal.distributed.ray_workers` (``connect``, ``gpu_share``,
``available_cpus``, ``put``, ``node_ip``, ``WorkerPool``) with processes forked from this one.
They start with shoal and torch already imported (an actor imports them, seconds each), and
a killed one dies as a killed actor does: its pipe closes, and the call in flight fails with
`WorkerFailed` naming it. The groups' own logic (the split, the all-reduce, restarts from
the synchronized state, relearning, resumes) then runs as it does on Ray; the tests of
`tests/distributed/test_learner_group.py` and `tests/test_cluster_faults.py` keep it on Ray
itself, and on a cluster losing a node.

`use_forked_learners(monkeypatch)` (the ``forked_learners`` fixture) makes the learner groups
and DD-PPO's ranks built in the test use it.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import signal
from multiprocessing.connection import Connection, wait
from typing import Any

import torch

from shoal.distributed.ray_workers import WorkerFailed


def _send(conn: Connection, value: Any) -> None:
    """``value`` pickled as Ray pickles it: a copy. (A `Connection`'s own ``send`` pickles
    torch tensors into shared memory, which both processes would then write.)"""
    conn.send_bytes(pickle.dumps(value))


def _receive(conn: Connection) -> Any:
    return pickle.loads(conn.recv_bytes())


def _serve(conn: Connection, cls: type, args: tuple) -> None:
    """A worker: build ``cls(*args)``, then answer ``(method, args)`` requests in order."""
    torch.set_num_threads(1)  # (forked after the test's threads: no OpenMP pool here)
    worker = cls(*args)
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


class ForkedPool:
    """`WorkerPool`'s calls of a learner group, on forked processes (module docstring)."""

    def __init__(self, cls: type, make_args: Any, num_workers: int, name: str = "worker",
                 **_: Any):  # fmt: skip
        context = multiprocessing.get_context("fork")
        self.name = name
        self.conns: list[Connection] = []
        self.processes: list[Any] = []
        for i in range(num_workers):
            ours, theirs = context.Pipe()
            process = context.Process(target=_serve, args=(theirs, cls, make_args(i)), daemon=True)
            process.start()
            theirs.close()
            self.conns.append(ours)
            self.processes.append(process)

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
        """``method`` on every worker (nothing restarts here: a failure fails the call)."""
        return self.lockstep(method, *args)

    def kill(self, i: int) -> None:
        """SIGKILL worker ``i``'s process, as a crash would."""
        os.kill(self.processes[i].pid, signal.SIGKILL)
        self.processes[i].join()

    def placement_nodes(self) -> list[str]:
        return ["this machine"] * len(self)

    def close(self) -> None:
        """Stop every worker (one waiting in a collective for a dead one is killed)."""
        for conn in self.conns:
            with contextlib.suppress(BrokenPipeError, ConnectionError, OSError):
                _send(conn, None)
        for process in self.processes:
            process.join(timeout=2)
            if process.is_alive():
                process.kill()
                process.join()
        for conn in self.conns:
            conn.close()


class ForkedRay:
    """The slice of Ray's worker API (`shoal.distributed.ray_workers`) a learner group uses,
    its workers forked from this process."""

    WorkerPool = ForkedPool

    @staticmethod
    def connect(address: str | None = None, num_cpus: int | None = None) -> None:
        assert address is None, "forked workers run on this machine"

    @staticmethod
    def gpu_share(device: str, n: int) -> float:
        assert torch.device(device if device != "auto" else "cpu").type == "cpu"
        return 0.0

    @staticmethod
    def available_cpus() -> float:
        return float(os.cpu_count() or 1)

    @staticmethod
    def put(value: Any) -> Any:
        """A copy, as Ray's object store holds one: a replay's batches are views of buffers
        its next sample overwrites, and a rebuilt group learns the kept ones again."""
        return pickle.loads(pickle.dumps(value))

    @staticmethod
    def node_ip() -> str:
        return "127.0.0.1"


def use_forked_learners(monkeypatch: Any) -> None:
    """From here to the end of the test, learner groups and DD-PPO fork their ranks from this
    process."""
    import shoal.algos.cores.rank_group as rank_group
    import shoal.algos.policy_gradient.ddppo as ddppo

    for module in (rank_group, ddppo):
        monkeypatch.setattr(module, "require_ray", lambda: ForkedRay)
