"""Replay throughput: prioritized sampling cycles and add rates, against a per-sample Python
sum tree.

Measured, each as the median of ``--repeats`` runs:

* **cycles/s**: one ``buffer.sample(512, beta)`` (the full n-step `ReplayBatch` as tensors)
  plus one ``buffer.update_priorities`` of the sampled indices, on a full buffer of 1,000,000
  CartPole-sized transitions (4 float32), for proportional, rank-based and uniform replay.
* **priority cycles/s**: the priority structure alone (sample indices and importance weights,
  then update them), for shoal's `ProportionalPriorities` and for the classic per-sample Python
  binary sum tree defined below, at the same capacity and batch size; their ratio.
* **adds**: transitions per second through ``buffer.add`` with 1, 8, 64 and 256 envs per call,
  once the buffer has wrapped (so every add also retires the overwritten row).

Usage: ``python benchmarks/replay.py [--repeats 3] [--quick]``. Exits 1 when a target is missed.
See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable

import gymnasium as gym
import numpy as np
import torch

from shoal.data import ProportionalPriorities, RankBasedPriorities, ReplayBuffer

OBS_SPACE = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
ACTION_SPACE = gym.spaces.Discrete(2)
ALPHA, BETA = 0.6, 0.4
TARGET_CYCLES = 2_000.0  # proportional sample + update cycles/s, capacity 1M, batch 512
TARGET_ADDS = 1_000_000.0  # transitions/s, small observations, 256 envs per add call
TARGET_ADD_ENVS = 256


class PythonSumTree:
    """The classic sum tree: a flat list in heap order (node ``k`` has children ``2k`` and
    ``2k + 1``, leaves from ``size``), walked by a Python loop once per sample and per update."""

    def __init__(self, capacity: int):
        self.size = 1 << max(capacity - 1, 0).bit_length()
        self.tree = [0.0] * (2 * self.size)

    def fill(self, values: np.ndarray) -> None:
        """Bulk build (a million per-item updates would take longer than the benchmark)."""
        tree = np.zeros(2 * self.size)
        tree[self.size : self.size + len(values)] = values
        level = self.size
        while level > 1:
            tree[level // 2 : level] = tree[level : 2 * level : 2] + tree[level + 1 : 2 * level : 2]
            level //= 2
        self.tree = tree.tolist()

    def update(self, index: int, value: float) -> None:
        tree = self.tree
        pos = index + self.size
        tree[pos] = value
        pos //= 2
        while pos >= 1:
            tree[pos] = tree[2 * pos] + tree[2 * pos + 1]
            pos //= 2

    def find(self, prefix: float) -> int:
        tree = self.tree
        pos = 1
        while pos < self.size:
            left = 2 * pos
            if prefix < tree[left]:
                pos = left
            else:
                prefix -= tree[left]
                pos = left + 1
        return pos - self.size


class PythonPriorities:
    """Proportional prioritized replay on `PythonSumTree`, one Python step per sample."""

    def __init__(self, capacity: int, alpha: float = ALPHA, eps: float = 1e-6):
        self.tree = PythonSumTree(capacity)
        self.alpha, self.eps, self.count = alpha, eps, capacity
        self.rng = random.Random(0)

    def sample(self, batch_size: int, beta: float) -> tuple[list[int], list[float]]:
        tree, total = self.tree, self.tree.tree[1]
        segment = total / batch_size
        indices, weights = [], []
        for i in range(batch_size):
            index = tree.find((i + self.rng.random()) * segment)
            indices.append(index)
            weights.append((self.count * tree.tree[index + tree.size] / total) ** -beta)
        largest = max(weights)
        return indices, [w / largest for w in weights]

    def update(self, indices: list[int], priorities: list[float]) -> None:
        for index, priority in zip(indices, priorities, strict=True):
            self.tree.update(index, (abs(priority) + self.eps) ** self.alpha)


def fill(buffer: ReplayBuffer, rng: np.random.Generator, envs: int) -> None:
    """Fill until the buffer has wrapped, with random small observations and ~1% episode
    ends, each followed by its autoreset row."""
    ended, falses = np.zeros(envs, bool), np.zeros(envs, bool)
    actions, rewards = np.zeros(envs, np.int64), np.ones(envs, np.float32)
    for _ in range(buffer.rows + 2):
        obs = rng.standard_normal((envs, 4), dtype=np.float32)
        terminated = (rng.random(envs) < 0.01) & ~ended
        buffer.add(obs, actions, rewards, terminated, falses, ~ended)
        ended = terminated


def rates(work: Callable[[], int]) -> tuple[float, float]:
    """Units of ``work()`` per wall-clock second and per CPU second of this thread. On a
    machine shared with other jobs the CPU-time rate is what a dedicated core would give."""
    wall, cpu = time.perf_counter(), time.thread_time()
    units = work()
    return units / (time.perf_counter() - wall), units / (time.thread_time() - cpu)


def median_rates(repeats: int, work: Callable[[], int]) -> tuple[float, float]:
    runs = [rates(work) for _ in range(repeats)]
    return statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)


def buffer_cycles(buffer: ReplayBuffer, cycles: int, batch: int, rng) -> Callable[[], int]:
    def work() -> int:
        for _ in range(cycles):
            sampled = buffer.sample(batch, BETA)
            buffer.update_priorities(sampled.indices, rng.random(batch))
        return cycles

    return work


def priority_cycles(priorities, cycles: int, batch: int, rng) -> Callable[[], int]:
    def work() -> int:
        for _ in range(cycles):
            if isinstance(priorities, PythonPriorities):
                indices, _ = priorities.sample(batch, BETA)
                priorities.update(indices, rng.random(batch).tolist())
            else:
                indices, _ = priorities.sample(batch, rng, BETA)
                priorities.update(indices, rng.random(batch))
        return cycles

    return work


def wrapped_adds(envs: int, capacity: int, seconds: float) -> tuple[int, Callable[[], int]]:
    """A prioritized buffer filled until it wrapped (so each add also retires a row), and
    work that adds to it for ``seconds`` and returns the transitions added."""
    rng = np.random.default_rng(envs)
    capacity = min(capacity, envs * 20_000)  # 1 env would need a million calls to wrap 1M
    buffer = ReplayBuffer(capacity, envs, OBS_SPACE, ACTION_SPACE, priorities=_proportional)
    fill(buffer, rng, envs)
    steps = [rng.standard_normal((envs, 4), dtype=np.float32) for _ in range(64)]
    actions, rewards = np.zeros(envs, np.int64), np.ones(envs, np.float32)
    falses, trues = np.zeros(envs, bool), np.ones(envs, bool)

    def work() -> int:
        calls, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            for obs in steps:
                buffer.add(obs, actions, rewards, falses, falses, trues)
            calls += len(steps)
        return calls * envs

    return buffer.capacity, work


def _proportional(capacity: int) -> ProportionalPriorities:
    return ProportionalPriorities(capacity, alpha=ALPHA)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--capacity", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cycles", type=int, default=2000, help="timed cycles per repeat")
    parser.add_argument("--python-cycles", type=int, default=60, help="cycles of the baseline")
    parser.add_argument("--add-seconds", type=float, default=1.0, help="per repeat and size")
    parser.add_argument(
        "--cpu-time",
        action="store_true",
        help="judge the targets by CPU time of the benchmark thread instead of wall-clock "
        "(for machines shared with other jobs)",
    )
    parser.add_argument("--quick", action="store_true", help="smoke check: short timings")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.cycles, args.python_cycles, args.add_seconds = 1, 200, 5, 0.2
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"python {platform.python_version()}, numpy {np.__version__}, torch {torch.__version__}, "
        f"{platform.machine()}, {os.cpu_count()} CPUs, load average {load:.2f}; capacity "
        f"{args.capacity:,}, batch {args.batch}, medians of {args.repeats}"
    )

    rows: list[tuple[str, tuple[float, float], str]] = []
    cycles = {}
    kinds = {"proportional": _proportional, "rank-based": RankBasedPriorities, "uniform": None}
    for name, priorities in kinds.items():
        buffer = ReplayBuffer(args.capacity, 1000, OBS_SPACE, ACTION_SPACE, priorities=priorities)
        fill(buffer, rng, 1000)
        rates(buffer_cycles(buffer, 10, args.batch, rng))  # warm-up
        work = buffer_cycles(buffer, args.cycles, args.batch, rng)
        cycles[name] = median_rates(args.repeats, work)
        rows.append((f"{name} buffer: sample + update", cycles[name], "cycles/s"))
        del buffer, work

    ours = _proportional(args.capacity)
    python = PythonPriorities(args.capacity)
    values = rng.random(args.capacity) ** ALPHA
    ours.activate(np.arange(args.capacity))
    ours.tree.set_all(values)
    python.tree.fill(values)
    ours_rate = median_rates(args.repeats, priority_cycles(ours, args.cycles, args.batch, rng))
    python_work = priority_cycles(python, args.python_cycles, args.batch, rng)
    python_rate = median_rates(args.repeats, python_work)
    ratio = (ours_rate[0] / python_rate[0], ours_rate[1] / python_rate[1])
    rows.append(("priorities only: shoal SumTree", ours_rate, "cycles/s"))
    rows.append(("priorities only: Python per-sample tree", python_rate, "cycles/s"))
    rows.append(("speed-up over the Python tree", ratio, "x"))
    del ours, python, python_work

    adds = {}
    for envs in (1, 8, 64, 256):
        capacity, work = wrapped_adds(envs, args.capacity, args.add_seconds)
        adds[envs] = median_rates(args.repeats, work)
        rows.append((f"add, {envs} envs/call (capacity {capacity:,})", adds[envs], "transitions/s"))
        del work

    width = max(len(label) for label, _, _ in rows)
    print(f"\n{'measure':<{width}}  {'wall-clock':>12}  {'CPU time':>12}  unit")
    for label, (wall, cpu), unit in rows:
        print(f"{label:<{width}}  {wall:>12,.1f}  {cpu:>12,.1f}  {unit}")

    judge = 1 if args.cpu_time else 0
    checks = [
        ("proportional sample+update cycles/s", cycles["proportional"], TARGET_CYCLES),
        (f"add transitions/s at {TARGET_ADD_ENVS} envs", adds[TARGET_ADD_ENVS], TARGET_ADDS),
    ]
    print(f"\ntargets judged by {'CPU time' if args.cpu_time else 'wall-clock'}:")
    failed = False
    for label, values, target in checks:
        ok = values[judge] >= target
        failed |= not ok
        print(
            f"{'PASS' if ok else 'FAIL'}  {label}: {values[judge]:,.0f} (target >= {target:,.0f})"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
