"""Workers in this process behind the calls of a Ray `WorkerPool`
(`shoal.distributed.ray_workers`), so that ``run.runners`` 0 runs the code that drives Ray
workers without Ray: A3C's gradient worker, AlphaZero's and MuZero's self-play worker, and
the tests' stand-in for Ray."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any


class InProcessPool:
    """``workers`` called in turn, each call run when it is made; a worker that raises
    raises here (there is no process to restart: ``restarts`` stays 0)."""

    restarts = 0

    def __init__(self, workers: list[Any]):
        self.workers = list(workers)

    @classmethod
    def build(
        cls, worker_cls: Callable[..., Any], make_args: Callable[[int], tuple], num_workers: int,
        **options: Any,
    ) -> InProcessPool:  # fmt: skip
        """As `WorkerPool` is built: worker ``i`` from ``worker_cls(*make_args(i))``
        (``options``, Ray's actor options, mean nothing here)."""
        return cls([worker_cls(*make_args(i)) for i in range(num_workers)])

    def __len__(self) -> int:
        return len(self.workers)

    def call_one(self, i: int, method: str, *args: Any) -> Any:
        return getattr(self.workers[i], method)(*args)

    def call_all(self, method: str, *args: Any) -> list[Any]:
        return [self.call_one(i, method, *args) for i in range(len(self.workers))]

    def call_each(self, method: str, args: Callable[[int], tuple]) -> list[Any]:
        return [self.call_one(i, method, *args(i)) for i in range(len(self.workers))]

    def lockstep(self, method: str, *args: Any) -> list[Any]:
        """As `WorkerPool.lockstep`: ``method`` on every worker, results in worker order (in
        turn here, so a collective between these workers needs only one of them)."""
        return self.call_all(method, *args)

    def tell_all(self, method: str, *args: Any) -> None:
        self.call_all(method, *args)

    def stream(
        self,
        method: str,
        args: Callable[[int], tuple] = lambda i: (),
        in_flight: int = 1,
        in_turn: bool = False,
    ) -> Iterator[tuple[int, Any]]:
        """Results worker by worker in turn (0, 1, ..., 0, ...): ``args(i)`` is read when the
        next result is asked for, after the previous one was used."""
        i = 0
        while True:
            yield i, self.call_one(i, method, *args(i))
            i = (i + 1) % len(self.workers)

    def close(self) -> None:
        for worker in self.workers:
            close = getattr(worker, "close", None)
            if close is not None:
                close()
