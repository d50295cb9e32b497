"""Instructions per training iteration: shoal PPO against Stable-Baselines3, without timing noise.

Wall-clock figures on a shared 2-core virtual machine move by +-30% from run to run. Valgrind's
callgrind counts executed instructions instead, which are the same on every run. This script
counts a process that builds the agent and trains ``WARMUP`` iterations, and one that trains
``WARMUP + ITERATIONS``; the difference is the cost of ``ITERATIONS`` training iterations alone
(imports and set-up cancel out). Both libraries use the rl-baselines3-zoo CartPole-v1 PPO
hyperparameters (8 envs x 32 steps, 20 epochs of one 256-sample minibatch).

It also splits the difference by shared library and names the math kernels (sgemm, MKL's in
torch or OpenBLAS's in NumPy, and MKL's tanh), so the report shows how much of each library's
cost is arithmetic and how much is overhead (Python, dispatch, allocation).

Usage: ``python benchmarks/ppo_cartpole_instructions.py`` (needs valgrind, about 10 minutes).
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

WARMUP = 2
ITERATIONS = 10
ROLLOUT = 8 * 32  # env steps per iteration with the zoo hyperparameters


def train(library: str, iterations: int) -> None:
    """The measured workload: build the agent, train ``iterations`` iterations."""
    import torch

    # The zoo hyperparameters are defined once, in the wall-clock benchmark beside this file.
    from ppo_cartpole import SHOAL_ZOO, sb3_model

    from shoal.core.threads import set_compute_threads

    set_compute_threads(1)  # torch and NumPy BLAS, as a shoal run sets them
    if library == "shoal":
        from shoal.algos.policy_gradient.ppo import PPO
        from shoal.api import build_config

        torch.manual_seed(0)
        algo = PPO(build_config("ppo", env="CartPole-v1", **SHOAL_ZOO))
        for _ in range(iterations):
            algo.train_iteration()
    else:
        sb3_model(seed=0).learn(iterations * ROLLOUT)


def count(library: str, iterations: int, workdir: Path) -> dict[str, int]:
    """Instructions per function of one process, read back with callgrind_annotate."""
    out = workdir / f"{library}-{iterations}.callgrind"
    subprocess.run(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable,
         __file__, "--work", library, str(iterations)],
        check=True, capture_output=True,
    )  # fmt: skip
    report = subprocess.run(
        ["callgrind_annotate", "--inclusive=no", "--threshold=100", str(out)],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    functions: dict[str, int] = collections.Counter()
    for line in report.splitlines():
        match = re.match(r"\s*([\d,]+) \([^)]*\)\s+(.*)$", line)
        if match and "PROGRAM TOTALS" not in line:
            functions[match.group(2)] += int(match.group(1).replace(",", ""))
    return functions


def library_of(function: str) -> str:
    match = re.search(r"\[(.*)\]\s*$", function)
    return match.group(1).rsplit("/", 1)[-1] if match else "?"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--work", nargs=2, metavar=("LIBRARY", "ITERATIONS"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.work:
        train(args.work[0], int(args.work[1]))
        return 0
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (Debian: apt-get install valgrind)")
        return 2
    totals = {}
    with tempfile.TemporaryDirectory() as tmp:
        for library in ("shoal", "sb3"):
            before = count(library, WARMUP, Path(tmp))
            after = count(library, WARMUP + ITERATIONS, Path(tmp))
            delta = {f: after.get(f, 0) - before.get(f, 0) for f in set(before) | set(after)}
            total = sum(delta.values())
            totals[library] = total
            math = sum(v for f, v in delta.items() if "sgemm" in f or "Tanh" in f)
            print(f"{library}: {total / 1e9:.3f}e9 instructions for {ITERATIONS} iterations, "
                  f"{total / (ITERATIONS * ROLLOUT) / 1e3:.0f}k per env step; "
                  f"sgemm + MKL tanh {100 * math / total:.0f}%")  # fmt: skip
            by_library = collections.Counter()
            for function, value in delta.items():
                by_library[library_of(function)] += value
            for name, value in by_library.most_common(5):
                print(f"    {name:<55} {100 * value / total:5.1f}%")
    ratio = totals["sb3"] / totals["shoal"]
    print(f"SB3 / shoal instructions per training iteration: {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
