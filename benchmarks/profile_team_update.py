"""Where a CTEDD or a MADDPG iteration spends its time on Chen 2019's CN-V1 (issue 41, part 4).

Trains ``--steps`` env steps with the ``ctedd-cn-v1`` tuned settings (or MADDPG with the same
cadence: 8 envs x 4 steps, 4 gradient steps of batch 1,024 per iteration, critics on the
state, the env's 1-dim message), one torch thread, no evaluations or distillation rounds,
inside cProfile and the PyTorch profiler, and prints the throughput after 4k steps (under the
profilers, so lower than without them), the cumulative Python profile and the operators by
self CPU time.

Usage: ``python benchmarks/profile_team_update.py ctedd|maddpg [--steps 12000]``
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import tempfile
import time

import torch

import shoal

COMMON = {
    "run.eval_every_steps": 0,
    "run.console": False,
    "run.tensorboard": False,
    "run.checkpoint_every_steps": 0,
    "run.torch_threads": 1,
    "run.seed": 0,
}
MADDPG = {
    "env.id": "shoal/cn-v1-v0",
    "env.num_envs": 8,
    "env.kwargs": {"continuous": True, "message_dim": 1},
    "critic_input": "state",
    "optim.lr": 0.01,
    "actor_lr": 0.01,
    "rollout_steps": 4,
    "replay.gradient_steps": 4,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("algo", choices=("ctedd", "maddpg"))
    parser.add_argument("--steps", type=int, default=12_000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    times: list[tuple[int, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        kwargs = {**COMMON, "run.total_steps": args.steps, "run.run_dir": tmp}
        if args.algo == "ctedd":
            call = lambda: shoal.train(  # noqa: E731
                tuned="ctedd-cn-v1", distill_every=10**9, evaluate_rounds=False,
                on_iteration=lambda step, _: times.append((step, time.perf_counter())),
                **kwargs,
            )  # fmt: skip
        else:
            call = lambda: shoal.train(  # noqa: E731
                "maddpg", on_iteration=lambda step, _: times.append((step, time.perf_counter())),
                **MADDPG, **kwargs,
            )  # fmt: skip
        python = cProfile.Profile()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as ops:
            python.enable()
            call()
            python.disable()
    start = next(t for t in times if t[0] >= 4000)
    rate = (times[-1][0] - start[0]) / (times[-1][1] - start[1])
    print(f"{args.algo}: {rate:.0f} env steps/s after 4k steps (under both profilers)")
    text = io.StringIO()
    pstats.Stats(python, stream=text).sort_stats("cumulative").print_stats(25)
    print(text.getvalue())
    print(ops.key_averages().table(sort_by="self_cpu_time_total", row_limit=18))


if __name__ == "__main__":
    main()
