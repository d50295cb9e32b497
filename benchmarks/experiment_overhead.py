"""The experiment runner's overhead: ``shoal experiment`` against the same runs by hand.

An 8-run experiment (the ``ppo-cartpole`` tuned example as it is: 200k env steps or its
target return, 8 seeds; ``--steps N`` runs N env steps each without the early stop) runs
with ``--jobs 2``; then the same 8 runs' ``shoal train --config`` commands run one after
another by hand (their configs are the experiment's). Reported: the experiment's wall-clock,
the runs' own wall-clock inside it (each run process from start to exit) and the runner's
overhead, the experiment's wall-clock minus the time the same runs take packed on the jobs
in the same order with no gaps, as a share of the latter (target: under 10%); and the
by-hand sequence's wall-clock, for the speed-up the two jobs give.

Usage: ``python benchmarks/experiment_overhead.py [--seeds 8] [--jobs 2] [--steps N]
[--json F]``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from shoal.studies.experiment import run_experiment
from shoal.studies.plan import plan

TARGET = 0.10


def makespan(durations: list[float], jobs: int) -> float:
    """When the last of ``durations`` ends if each starts, in order, the moment one of
    ``jobs`` slots is free (what a runner with no overhead of its own would take)."""
    free = [0.0] * jobs
    for duration in durations:
        slot = free.index(min(free))
        free[slot] += duration
    return max(free)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--steps", type=int, help="env steps per run (default: the tuned)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="experiment-overhead-"))
    spec = {"name": "overhead", "base": "ppo-cartpole", "seeds": args.seeds}
    if args.steps:
        spec["config"] = {"run": {"total_steps": args.steps, "target_return": None}}
    experiment = plan(spec, root / "experiment")
    start = time.perf_counter()
    status = run_experiment(experiment, jobs=args.jobs)
    wall = time.perf_counter() - start
    durations = [status[run.name]["wall_s"] for run in experiment.runs]
    own = sum(durations)
    packed = makespan(durations, args.jobs)
    overhead = wall - packed
    share = overhead / packed
    print(f"experiment, {args.seeds} runs, --jobs {args.jobs}: {wall:.1f} s; the runs' own "
          f"time {own:.1f} s, {packed:.1f} s when packed on {args.jobs} jobs in order with "
          f"no gaps ({own / args.jobs:.1f} s if they split evenly); runner overhead "
          f"{overhead:.2f} s = {share:.1%}")  # fmt: skip
    by_hand = 0.0
    for run in experiment.runs:
        config = experiment.directory / "configs" / f"{run.name}.yaml"
        command = [sys.executable, "-m", "shoal.cli", "train", "--config", str(config),
                   "--run.run-dir", str(root / "by-hand" / run.name)]  # fmt: skip
        started = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True)
        by_hand += time.perf_counter() - started
    print(f"the same runs one after another by hand: {by_hand:.1f} s "
          f"(the experiment is {by_hand / wall:.2f}x faster)")  # fmt: skip
    met = share < TARGET
    print(f"target: runner overhead < {TARGET:.0%} of the runs' own time: "
          f"{'met' if met else 'MISSED'}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({
            "seeds": args.seeds, "jobs": args.jobs, "steps": args.steps, "experiment_s": wall,
            "runs_own_s": own, "packed_s": packed, "overhead_s": overhead,
            "overhead_share": share,
            "by_hand_s": by_hand,
        }, indent=2))  # fmt: skip
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
