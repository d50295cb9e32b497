"""Ray's worker API (`shoal.distributed.ray_workers`) in this process, for tests.

A distributed algorithm's logic (what its workers are asked, what it does with their
results, what its checkpoint holds) runs here without starting an actor: each worker is an
object in this process whose calls run when they are made. It stays what it would be in a
process of its own: arguments, stored objects and results are copies (Ray serializes them),
and each worker keeps its own global random generators. So a run whose results are taken in
turn (``results_in_turn``) is, bit for bit, the run it is on Ray, which
`assert_ray_run_is_the_in_process_run` checks once per algorithm; the algorithm's other
checks (smoke, resume, NaN losses) run here in a fraction of a second instead of seconds of
actor start-ups. What only Ray does (actors that die and restart, lost nodes, collectives
between processes) is tested on Ray, and so is a run that calls its workers from a thread of
its own (sampling ahead, ``replay.max_lag``): the random state is swapped per call, which a
second thread drawing at the same time would see.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import importlib
import random
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from state_helpers import assert_states_equal, metric_rows

import shoal
from shoal.distributed.in_process import InProcessPool
from shoal.train.checkpoint import load_checkpoint

RAY_MODULES = (
    "shoal.distributed",
    "shoal.algos.value.apex",
    "shoal.collect.ray",
    "shoal.collect.multi_agent_ray",
    "shoal.algos.multi_agent.distributed_maddpg",
    "shoal.algos.policy_gradient.ddppo",
    "shoal.algos.policy_gradient.a3c",
    "shoal.algos.cores.rank_group",
)
"""The modules holding `shoal.distributed.require_ray` under their own name (the others
import it from `shoal.distributed` when they call it)."""


class _Ref:
    """A finished call: its result, or the exception it raised."""

    def __init__(self, call: Callable[[], Any]):
        try:
            self.value, self.error = call(), None
        except Exception as exc:  # raised again where the result is taken
            self.value, self.error = None, exc


class _OwnRandomState:
    """The global random generators (Python's, NumPy's, torch's) of one worker, kept apart
    from the caller's as a worker process of its own keeps them: a worker that draws from
    them draws what it would draw under Ray, however its calls interleave with others'."""

    def __init__(self) -> None:
        self.state: tuple[Any, Any, Any] | None = None

    @contextlib.contextmanager
    def inside(self) -> Iterator[None]:
        outside = (random.getstate(), np.random.get_state(), torch.get_rng_state())
        if self.state is not None:
            _set_random_state(self.state)
        try:
            yield
        finally:
            self.state = (random.getstate(), np.random.get_state(), torch.get_rng_state())
            _set_random_state(outside)


def _set_random_state(state: tuple[Any, Any, Any]) -> None:
    random.setstate(state[0])
    np.random.set_state(state[1])
    torch.set_rng_state(state[2])


def _copied(value: Any) -> Any:
    """What the other side of a Ray call receives: a copy (a `_Ref` stands for its value)."""
    if isinstance(value, _Ref):
        value = get(value)
    return copy.deepcopy(value)


class RefPool(InProcessPool):
    """shoal's in-process pool with Ray's ``submit``: a call runs when it is made, its result
    (or exception) held in a reference that `get` reads. Each worker keeps its own global
    random state, and sees copies, as in its own process."""

    def __init__(self, workers: list[Any], states: list[_OwnRandomState]):
        super().__init__(workers)
        self.states = states

    @classmethod
    def build(
        cls, worker_cls: Callable[..., Any], make_args: Callable[[int], tuple], num_workers: int,
        **options: Any,
    ) -> RefPool:  # fmt: skip
        states = [_OwnRandomState() for _ in range(num_workers)]
        workers = []
        for i, state in enumerate(states):
            args = [_copied(a) for a in make_args(i)]
            with state.inside():
                workers.append(worker_cls(*args))
        return cls(workers, states)

    def submit(self, i: int, method: str, *args: Any) -> _Ref:
        args = tuple(_copied(a) for a in args)

        def call() -> Any:
            with self.states[i].inside():
                return copy.deepcopy(getattr(self.workers[i], method)(*args))

        return _Ref(call)

    def call_one(self, i: int, method: str, *args: Any) -> Any:
        return get(self.submit(i, method, *args))

    def stream(
        self,
        method: str,
        args: Callable[[int], tuple] = lambda i: (),
        in_flight: int = 1,
        in_turn: bool = False,
    ) -> Iterator[tuple[int, Any]]:
        """As `WorkerPool.stream` with its results in turn (one of the orders Ray may give
        without ``in_turn``, the order it gives with it): each worker's ``in_flight``
        requests are sent ahead, the next one as soon as one result is taken."""
        queued: list[collections.deque[_Ref]] = [collections.deque() for _ in self.workers]
        for i in range(len(self.workers)):
            for _ in range(in_flight):
                queued[i].append(self.submit(i, method, *args(i)))
        i = 0
        while True:
            yield i, get(queued[i].popleft())
            queued[i].append(self.submit(i, method, *args(i)))
            i = (i + 1) % len(self.workers)


def get(ref: Any) -> Any:
    if not isinstance(ref, _Ref):
        return ref
    if ref.error is not None:
        raise ref.error
    return ref.value


class InProcessRay:
    """The functions of `shoal.distributed.ray_workers` that the algorithms call, in this
    process."""

    WORKER_FAILURES: tuple[type[BaseException], ...] = ()
    WorkerPool = RefPool.build
    get = staticmethod(get)

    @staticmethod
    def connect(address: str | None = None, num_cpus: int | None = None) -> None:
        return None

    @staticmethod
    def put(value: Any) -> Any:
        return copy.deepcopy(value)

    @staticmethod
    def wait_first(refs: Any) -> Any:
        return next(iter(refs))

    @staticmethod
    def gpu_share(device: str, learners: int) -> float:
        return 0.0

    @staticmethod
    def node_ip() -> str:
        return "127.0.0.1"


def use_in_process_ray(monkeypatch: Any) -> None:
    """From here to the end of the test, every module that asks for Ray's worker API gets
    `InProcessRay`."""
    # All imported first: one imported after `shoal.distributed` was patched would bind the
    # stand-in under its own name, and keep it once the test is over.
    modules = [importlib.import_module(name) for name in RAY_MODULES]
    for module in modules:
        monkeypatch.setattr(module, "require_ray", InProcessRay)


def assert_ray_run_is_the_in_process_run(
    tmp_path: Any, monkeypatch: Any, algo: str, total_steps: int, seed: int = 5, **overrides: Any
) -> tuple[Any, list[dict[str, Any]]]:
    """Train ``algo`` with one seed on the session's Ray, then with its workers in this
    process: both runs end in the same state, bit for bit, having logged the same metrics
    (timing aside). Returns the Ray run's result and its metric rows."""
    on_ray = shoal.train(algo, seed=seed, total_steps=total_steps,
                         run_dir=str(tmp_path / "ray"), **overrides)  # fmt: skip
    use_in_process_ray(monkeypatch)
    here = shoal.train(algo, seed=seed, total_steps=total_steps,
                       run_dir=str(tmp_path / "here"), **overrides)  # fmt: skip
    assert_states_equal(
        load_checkpoint(on_ray.run_dir).state["algorithm"],
        load_checkpoint(here.run_dir).state["algorithm"],
    )
    rows = metric_rows(on_ray.run_dir)
    assert rows == metric_rows(here.run_dir)
    return on_ray, rows
