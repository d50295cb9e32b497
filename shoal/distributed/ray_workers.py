"""Ray behind a small interface: connect to a cluster, and pools of worker actors that restart.

A `WorkerPool` holds N actors of one class, each built from its own constructor arguments (its
seed among them). A call that fails because the actor died (killed process, lost node) or
raised (an exception in an environment) restarts that actor from the same arguments, lets the
owner restore what the fresh actor lacks (``on_restart``: the latest weights, say), logs the
event and retries, so that training goes on. Both synchronous calls on every worker and an
asynchronous stream of results (`WorkerPool.stream`) are supported.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Callable, Generator, Iterable
from typing import Any

import ray
import ray.exceptions
import ray.util
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from shoal.core.errors import DistributedError

log = logging.getLogger("shoal.distributed")

MAX_FAILURES_IN_A_ROW = 3
"""Restarts of one worker without a successful call in between before the pool gives up."""

WORKER_FAILURES = (ray.exceptions.RayActorError, ray.exceptions.RayTaskError)
"""A died actor, or an exception raised inside one."""


def connect(address: str | None = None, num_cpus: int | None = None) -> None:
    """Start a local Ray (``address`` None) or join the cluster at ``address``; no-op when
    Ray is already initialized in this process (tests share one local instance)."""
    if ray.is_initialized():
        return
    # Sampling workers use one torch thread each: more would oversubscribe the cores.
    thread_vars = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    if address is None:
        # A local Ray's workers inherit the environment Ray starts with. Setting the variables
        # there rather than as a job runtime_env lets actors take Ray's prestarted workers:
        # with a runtime_env each worker waits on its set-up, about 1 s more per start here.
        saved = {name: os.environ.get(name) for name in thread_vars}
        os.environ.update(thread_vars)
        try:
            # "local": a Ray of its own, even where one started with `ray start` runs on this
            # machine (Ray would join that one, whose CPUs cannot be set, and fail).
            ray.init(
                address="local",
                num_cpus=num_cpus or os.cpu_count(),
                include_dashboard=False,
                configure_logging=False,
                log_to_driver=True,
            )
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
        return
    runtime_env = {"env_vars": thread_vars}
    _check_reachable(address)
    try:
        ray.init(address=address, configure_logging=False, runtime_env=runtime_env)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise DistributedError(
            f"cannot join the Ray cluster at {address!r}: {exc}. Check run.ray_address, or "
            "leave it unset to start a local Ray"
        ) from exc


def _check_reachable(address: str) -> None:
    """Fail within seconds on an address where nothing listens (ray.init would retry for
    20 s and then print a bare ConnectionError)."""
    if address == "auto" or "://" in address:
        return  # resolved by Ray itself
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise DistributedError(
            f"run.ray_address must be HOST:PORT (the head node's GCS port, usually 6379), "
            f"'auto' or a ray:// URL; got {address!r}"
        )
    try:
        with socket.create_connection((host, int(port)), timeout=5):
            pass
    except OSError as exc:
        raise DistributedError(
            f"no Ray cluster answers at {address!r} ({exc}). Start one with `ray start "
            "--head` on that machine, or leave run.ray_address unset to start a local Ray"
        ) from exc


def gpu_share(device: str, learners: int) -> float:
    """The GPUs each of ``learners`` learner actors asks Ray for when the run's device is
    ``device``: none on the CPU; otherwise one each, or an equal share where the cluster has
    fewer GPUs than learners. ``auto`` takes GPUs only where the cluster has some."""
    if device == "cpu":
        return 0.0
    gpus = float(ray.cluster_resources().get("GPU", 0.0))
    if gpus == 0.0:
        if device == "auto":
            return 0.0
        raise DistributedError(
            f"run.device = {device!r} but the Ray cluster has no GPUs; use run.device cpu or "
            "auto, or add GPU nodes"
        )
    return min(1.0, gpus / learners)


def cluster_cpus() -> float:
    """The CPUs of the Ray cluster this process is connected to."""
    return float(ray.cluster_resources().get("CPU", 1.0))


def available_cpus() -> float:
    """The CPUs of the Ray cluster that no actor or task has claimed now."""
    return float(ray.available_resources().get("CPU", 0.0))


def shutdown() -> None:
    ray.shutdown()


def put(value: Any) -> Any:
    """Store ``value`` once in the object store; pass the reference to many actors."""
    return ray.put(value)


def node_ip() -> str:
    return ray.util.get_node_ip_address()


class WorkerFailed(DistributedError):
    """A worker of a pool called in lockstep (`WorkerPool.lockstep`) failed."""


class WorkerPool:
    """N Ray actors of ``cls``; worker ``i`` is built as ``cls(*make_args(i))``.

    ``on_restart(i)`` runs after worker ``i`` was restarted and before the failed call is
    retried; it restores state the owner keeps for its workers (it may call `call_one`).
    After ``max_restarts`` restarts in total the pool gives up with a `DistributedError`.
    """

    def __init__(
        self,
        cls: type,
        make_args: Callable[[int], tuple],
        num_workers: int,
        name: str = "worker",
        max_restarts: int = 100,
        on_restart: Callable[[int], None] | None = None,
        num_cpus: float | None = None,
        num_gpus: float = 0.0,
        placement: str | None = None,
    ):
        # max_concurrency 1: calls on one actor run in the order they were made, so weights
        # set before a sample request are the weights that sample uses.
        options: dict[str, Any] = {"max_concurrency": 1}
        if num_cpus is not None:
            options["num_cpus"] = num_cpus
        if num_gpus:  # Ray sets the actor's CUDA_VISIBLE_DEVICES to its share
            options["num_gpus"] = num_gpus
        self._remote: Any = ray.remote(cls)
        self._options = options
        self._make_args = make_args
        self.name = name
        self.max_restarts = max_restarts
        self.on_restart = on_restart
        self.restarts = 0
        self._failures_in_a_row = [0] * num_workers
        self._group = None
        if placement is not None:
            bundle = {"CPU": num_cpus or 1.0, **({"GPU": num_gpus} if num_gpus else {})}
            self._group = _placement_group(bundle, num_workers, placement, name)
        self.workers: list[Any] = [self._build(i) for i in range(num_workers)]

    def _build(self, i: int) -> Any:
        """A fresh actor for worker ``i`` (in bundle ``i`` of the placement group, if any)."""
        options = self._options
        if self._group is not None:
            strategy = PlacementGroupSchedulingStrategy(self._group, placement_group_bundle_index=i)
            options = {**options, "scheduling_strategy": strategy}
        return self._remote.options(**options).remote(*self._make_args(i))

    def __len__(self) -> int:
        return len(self.workers)

    def submit(self, i: int, method: str, *args: Any) -> Any:
        """Start ``method`` on worker ``i``; returns the result's reference."""
        return getattr(self.workers[i], method).remote(*args)

    def call_one(self, i: int, method: str, *args: Any) -> Any:
        """``method`` on worker ``i`` and wait; restart and retry on failure."""
        while True:
            try:
                result = ray.get(self.submit(i, method, *args))
            except WORKER_FAILURES as exc:
                self.restart(i, exc)
                continue
            self._failures_in_a_row[i] = 0
            return result

    def call_all(self, method: str, *args: Any) -> list[Any]:
        """``method`` on every worker in parallel; the results in worker order. Failed
        workers are restarted and their call retried."""
        return self.call_each(method, lambda i: args)

    def call_each(self, method: str, args: Callable[[int], tuple]) -> list[Any]:
        """``method(*args(i))`` on every worker ``i`` in parallel; the results in worker
        order. A failed worker is restarted and its own call sent again."""
        refs = [self.submit(i, method, *args(i)) for i in range(len(self.workers))]
        results = []
        for i, ref in enumerate(refs):
            try:
                results.append(ray.get(ref))
                self._failures_in_a_row[i] = 0
            except WORKER_FAILURES as exc:
                self.restart(i, exc)
                results.append(self.call_one(i, method, *args(i)))
        return results

    def lockstep(self, method: str, *args: Any) -> list[Any]:
        """``method`` on every worker at once, results in worker order, failing at the first
        worker that fails with a `WorkerFailed` naming it, without waiting for the others
        (in a collective they would wait for it) and without restarting anything: workers in
        lockstep (a process group) cannot take a fresh one in."""
        pending = {self.submit(i, method, *args): i for i in range(len(self.workers))}
        results: list[Any] = [None] * len(pending)
        while pending:
            ref = wait_first(pending)
            i = pending.pop(ref)
            try:
                results[i] = ray.get(ref)
            except WORKER_FAILURES as exc:
                raise WorkerFailed(
                    f"{self.name} {i} failed during {method} ({type(exc).__name__})"
                ) from exc
        return results

    def tell_all(self, method: str, *args: Any) -> None:
        """``method`` on every worker without waiting (a failure shows at the next call)."""
        for i in range(len(self.workers)):
            self.submit(i, method, *args)

    def stream(
        self,
        method: str,
        args: Callable[[int], tuple] = lambda i: (),
        in_flight: int = 1,
        in_turn: bool = False,
    ) -> Generator[tuple[int, Any], None, None]:
        """Results of ``method`` as workers finish them, fastest first: each worker keeps
        ``in_flight`` requests queued and gets a new one (with ``args(i)`` of that moment)
        as soon as one of its results is taken. Close the iterator to stop; results still
        in flight then are dropped.

        ``in_turn``: results are taken in turn instead, worker 0, 1, ..., n - 1, 0, ...
        (each worker's oldest request), waiting for the worker whose turn it is. Workers
        still run at once; which result is taken, and so what each new request is sent,
        is then a matter of counting, not of timing."""
        # Each request remembers the actor it went to: one that died after the owner already
        # replaced it (a failed `set_weights` found the death first) is re-issued to the new
        # actor without counting a second restart for the same failure.
        pending: dict[Any, tuple[int, Any]] = {}

        def request(i: int) -> None:
            pending[self.submit(i, method, *args(i))] = (i, self.workers[i])

        for i in range(len(self.workers)):
            for _ in range(in_flight):
                request(i)
        turn = 0
        try:
            while pending:
                if in_turn:  # ray.get below waits for it
                    ref = next(r for r, (w, _) in pending.items() if w == turn)
                else:
                    [ref], _ = ray.wait(list(pending), num_returns=1)
                i, actor = pending.pop(ref)
                try:
                    result = ray.get(ref)
                except WORKER_FAILURES as exc:
                    # Requests queued on the dead actor die with it; re-issue all of them.
                    lost = [r for r, (_, a) in pending.items() if a is actor]
                    for r in lost:
                        del pending[r]
                    if self.workers[i] is actor:
                        self.restart(i, exc)
                    for _ in range(len(lost) + 1):
                        request(i)
                    continue
                self._failures_in_a_row[i] = 0
                turn = (i + 1) % len(self.workers)
                yield i, result
                request(i)
        finally:
            for ref in pending:
                ray.cancel(ref)

    def restart(self, i: int, error: BaseException) -> None:
        """Replace worker ``i`` by a fresh actor built from the same arguments. A worker that
        cannot be built, or fails again before any call succeeded since its last restart
        (``MAX_FAILURES_IN_A_ROW`` times), has a problem a restart does not fix: give up."""
        self.restarts += 1
        self._failures_in_a_row[i] += 1
        cause = _describe(error)
        if "creation task" in str(error):
            raise DistributedError(f"{self.name} {i} could not be built: {cause}") from error
        if self._failures_in_a_row[i] > MAX_FAILURES_IN_A_ROW:
            raise DistributedError(
                f"{self.name} {i} failed {MAX_FAILURES_IN_A_ROW + 1} times in a row ({cause}); "
                "giving up"
            ) from error
        if self.restarts > self.max_restarts:
            raise DistributedError(
                f"{self.name} {i} failed ({cause}) after {self.max_restarts} restarts in this "
                "run; giving up"
            ) from error
        log.warning("%s %d failed (%s); restarting it with its seed", self.name, i, cause)
        with contextlib.suppress(Exception):  # already gone
            ray.kill(self.workers[i], no_restart=True)
        self.workers[i] = self._build(i)
        if self.on_restart is not None:
            self.on_restart(i)

    def kill(self, i: int) -> None:
        """Kill worker ``i``'s process, as a crash would (for tests of recovery), and return
        once Ray reports it dead: every request to it fails from then on, so that a test
        finds the crash within the next call, however loaded the machine. (Ray learns of
        a death in its own time, which on a busy machine can be many iterations later.)"""
        worker = self.workers[i]
        ray.kill(worker, no_restart=True)
        while True:
            try:
                ray.get(worker.__ray_ready__.remote())
            except WORKER_FAILURES:
                return

    def placement_nodes(self) -> list[str]:
        """The ids of the nodes the placement group's bundles are on, in bundle order (empty
        without a placement group)."""
        if self._group is None:
            return []
        table = ray.util.placement_group_table(self._group)["bundles_to_node_id"]
        return [table[i] for i in sorted(table)]

    def close(self) -> None:
        for worker in self.workers:
            with contextlib.suppress(Exception):
                ray.kill(worker, no_restart=True)
        self.workers = []
        if self._group is not None:
            with contextlib.suppress(Exception):
                ray.util.remove_placement_group(self._group)
            self._group = None


PLACEMENT_TIMEOUT_S = 120.0
"""How long a pool waits for the cluster to place its placement group before failing."""


def _placement_group(bundle: dict[str, float], count: int, strategy: str, name: str) -> Any:
    """``count`` bundles of ``bundle`` reserved together (``strategy``: PACK puts them on as
    few nodes as possible, SPREAD on as many), or a `DistributedError` saying what the
    cluster lacks."""
    group = ray.util.placement_group([dict(bundle) for _ in range(count)], strategy=strategy)
    ready, _ = ray.wait([group.ready()], timeout=PLACEMENT_TIMEOUT_S)
    if not ready:
        ray.util.remove_placement_group(group)
        raise DistributedError(
            f"the Ray cluster could not place {count} {name}s with {bundle} each within "
            f"{PLACEMENT_TIMEOUT_S:.0f} s (it has {ray.cluster_resources()}); ask for fewer, or "
            "add nodes"
        )
    return group


def _describe(error: BaseException) -> str:
    """One line: the exception raised inside the actor, or why the actor died."""
    if isinstance(error, ray.exceptions.RayTaskError):
        cause = error.cause if error.cause is not None else error
        lines = str(cause).strip().splitlines()
        return f"{type(cause).__name__}: {lines[-1] if lines else ''}"
    lines = [line for line in str(error).strip().splitlines() if line.strip()]
    if "creation task" in str(error) and lines:
        return lines[-1].strip()  # the constructor's exception is the last line
    return f"{type(error).__name__}: the actor process died"


def wait_first(refs: Iterable[Any]) -> Any:
    """The first of ``refs`` to finish (the others keep running)."""
    [ready], _ = ray.wait(list(refs), num_returns=1)
    return ready


def get(ref: Any) -> Any:
    return ray.get(ref)


@ray.remote
def _run_command(command: list[str], log_path: str) -> int:
    import subprocess

    with open(log_path, "ab") as log:
        return subprocess.run(command, stdout=log, stderr=subprocess.STDOUT).returncode


class RemoteCommand:
    """A command run as a Ray task, on whichever node has ``cpus`` free, with its output in
    ``log_path`` (a path every node can write: shared storage on a cluster); ``poll`` and
    ``wait`` as `subprocess.Popen`'s (`shoal.experiment` runs its runs through either)."""

    def __init__(self, command: list[str], log_path: str, cpus: float = 1.0) -> None:
        self.ref = _run_command.options(num_cpus=cpus).remote(command, log_path)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            ready, _ = ray.wait([self.ref], timeout=0)
            if ready:
                self.returncode = ray.get(ready[0])
        return self.returncode

    def wait(self) -> int:
        if self.returncode is None:
            self.returncode = ray.get(self.ref)
        return self.returncode

    def cancel(self) -> None:
        ray.cancel(self.ref, force=True)


@ray.remote
def _call(function: Callable[..., Any], args: tuple) -> Any:
    return function(*args)


def run_tasks(function: Callable[..., Any], calls: list[tuple], cpus: float = 1.0) -> list:
    """``function(*args)`` for each ``args`` of ``calls`` as Ray tasks of ``cpus`` each, on
    whichever nodes have them free; their results in order (a task's error is raised here).
    ``function`` must be importable by name on every node (a module-level function)."""
    return ray.get([_call.options(num_cpus=cpus).remote(function, args) for args in calls])
