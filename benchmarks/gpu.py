"""Learner throughput on a GPU against the same runs on the CPU, with and without torch.compile.

Cases (each one configuration of shoal's own tuned examples, timed inside its training loop):

* ``ppo-pong-N``: PPO on PongNoFrameskip-v4 with the Nature CNN (the ``ppo-pong`` tuned
  example: 128 steps per env, 4 epochs of 256-sample minibatches) with N = 8, 32 and 128 envs
  stepped by ale-py's native vector env (its own threads). Figure: training frames/s =
  agent steps x 4 (the frame skip) / training seconds.
* ``sac-halfcheetah-B``: SAC on HalfCheetah-v5 (``sac-halfcheetah``: 256-256 networks, one
  env, one gradient step per env step) with batches of B = 256 and 1024. Figure: gradient
  steps (updates) per second of training, acting and env steps included, as LeanRL reports
  its SAC figure.
* ``dqn-pong``: DQN on Pong (``dqn-pong``: Nature CNN, frame replay, batch 32, 8 gradient
  steps per 32 agent steps). Figure: updates/s, acting and env steps included.
* ``ppo-cartpole`` and ``sac-pendulum``: the small networks of control tasks (the tuned
  examples, PPO through autograd), for what compilation gains and costs there.

Each case runs in a fresh process per (device, compile) combination: ``--warmup``
iterations (where torch.compile compiles; their time is reported as start-up) then
``--iterations`` timed ones. Learning starts before the timed iterations (replay-based cases
act randomly only as long as their replay needs), so every timed iteration trains.

Targets on one H100-class GPU (16 CPU cores): PPO Pong >= 10,000 training frames/s with 128
envs, SAC >= 1,000 updates/s at batch 256. Published on an H100 (LeanRL's README): CleanRL's
PPO Atari with EnvPool 1,022 frames/s and LeanRL's torch.compile + CUDA-graph version 6,809;
SAC 127 (CleanRL) and 725 (LeanRL) updates/s.

Usage: ``python benchmarks/gpu.py [--cases ppo sac dqn] [--devices cuda cpu] [--compile off
on] [--precisions float32 bfloat16] [--iterations 20] [--json out.json] [--quick]`` (needs
``pip install -e '.[atari,mujoco]'``; without a GPU, ``--devices cpu`` measures the CPU rows
alone). See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

FRAME_SKIP = 4
TARGETS = {"ppo-pong-128": ("frames/s", 10_000.0), "sac-halfcheetah-256": ("updates/s", 1_000.0)}


def cases() -> dict[str, dict[str, Any]]:
    """Name -> tuned example, overrides and the figure it reports."""
    quiet = {
        "run.console": False,
        "run.tensorboard": False,
        "run.checkpoint_every_steps": 0,
        "run.eval_every_steps": 0,
        "run.total_steps": 10**9,
    }
    table: dict[str, dict[str, Any]] = {}
    for envs in (8, 32, 128):
        table[f"ppo-pong-{envs}"] = {
            "tuned": "ppo-pong",
            "overrides": {**quiet, "env.num_envs": envs},
            "figure": "frames/s",
            "image": True,
        }
    for batch in (256, 1024):
        table[f"sac-halfcheetah-{batch}"] = {
            "tuned": "sac-halfcheetah",
            # Learning starts at once: every timed iteration takes its gradient step.
            "overrides": {
                **quiet,
                "replay.batch_size": batch,
                "replay.learning_starts": batch,
                "rollout_steps": 64,
                "replay.gradient_steps": 64,
            },
            "figure": "updates/s",
        }
    table["dqn-pong"] = {
        "tuned": "dqn-pong",
        "overrides": {**quiet, "replay.learning_starts": 2_000, "replay.buffer_size": 50_000},
        "figure": "updates/s",
        "image": True,
    }
    table["ppo-cartpole"] = {
        "tuned": "ppo-cartpole",
        "overrides": {**quiet, "run.target_return": None, "model.backend": "torch"},
        "figure": "env steps/s",
    }
    table["sac-pendulum"] = {
        "tuned": "sac-pendulum",
        "overrides": {**quiet, "run.target_return": None},
        "figure": "updates/s",
    }
    return table


def measure(
    case: str, device: str, compiled: bool, warmup: int, iterations: int, precision: str
) -> dict:
    """One case in this process: build, warm up, time ``iterations`` training iterations."""
    import torch

    import shoal
    from shoal.core.seeding import seed_torch
    from shoal.core.threads import set_compute_threads
    from shoal.registry import algorithm_for_config

    spec = cases()[case]
    overrides = {**spec["overrides"], "run.device": device, "run.compile": compiled}
    if precision != "float32":  # only the image encoders take a mixed precision
        overrides["model.precision"] = precision
    with tempfile.TemporaryDirectory() as tmp:
        overrides["run.run_dir"] = tmp
        config = shoal.api.build_config(tuned=spec["tuned"], **overrides)
        set_compute_threads(config.run.torch_threads)
        seed_torch(config.run.seed)
        start = time.perf_counter()
        algo = algorithm_for_config(config).algorithm_cls(config)
        try:
            while _grad_steps(algo) == 0 and spec["figure"] == "updates/s":
                algo.train_iteration()  # random acting until the replay feeds the learner
            for _ in range(warmup):
                algo.train_iteration()
            _sync()
            startup_s = time.perf_counter() - start
            steps0, grads0, t0 = algo.env_steps, _grad_steps(algo), time.perf_counter()
            for _ in range(iterations):
                algo.train_iteration()
            _sync()
            seconds = time.perf_counter() - t0
            steps, grads = algo.env_steps - steps0, _grad_steps(algo) - grads0
        finally:
            algo.close()
    value = {
        "frames/s": steps * FRAME_SKIP / seconds,
        "env steps/s": steps / seconds,
        "updates/s": grads / seconds,
    }[spec["figure"]]
    return {
        "case": case,
        "device": device,
        "compile": compiled,
        "precision": precision,
        "figure": spec["figure"],
        "value": value,
        "env_steps_per_s": steps / seconds,
        "updates_per_s": grads / seconds,
        "seconds": seconds,
        "startup_s": startup_s,
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


def _grad_steps(algo: Any) -> int:
    """Gradient steps so far (replay-based learners count them; PPO's figure is frames/s)."""
    return int(getattr(getattr(algo, "learner", None), "grad_steps", 0))


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def run_in_subprocess(
    case: str, device: str, compiled: bool, precision: str, args: argparse.Namespace
) -> dict:
    command = [
        sys.executable,
        __file__,
        "--one",
        case,
        "--devices",
        device,
        "--compile",
        "on" if compiled else "off",
        "--warmup",
        str(args.warmup),
        "--iterations",
        str(args.iterations),
        "--precisions",
        precision,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return {
            "case": case,
            "device": device,
            "compile": compiled,
            "precision": precision,
            "error": " | ".join(tail),
        }
    return json.loads(lines[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cases", nargs="+", default=["ppo-pong", "sac-halfcheetah", "dqn-pong"],
        help="case names or prefixes (ppo-pong, sac-halfcheetah, dqn-pong, ppo-cartpole, "
        "sac-pendulum)",
    )  # fmt: skip
    parser.add_argument("--devices", nargs="+", default=None, help="default: cuda (if any) cpu")
    parser.add_argument("--compile", nargs="+", default=["off", "on"], choices=["off", "on"])
    parser.add_argument(
        "--precisions", nargs="+", default=["float32"], choices=["float32", "bfloat16", "float16"],
        help="model.precision of the image cases (Pong); the others run in float32",
    )  # fmt: skip
    parser.add_argument("--warmup", type=int, default=3, help="untimed iterations per run")
    parser.add_argument("--iterations", type=int, default=10, help="timed iterations per run")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per run")
    parser.add_argument("--json", type=Path, help="also write every run here")
    parser.add_argument("--quick", action="store_true", help="1 warm-up, 2 timed iterations")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.warmup, args.iterations = 1, 2
    if args.one:  # a child process: one measurement as one JSON line
        result = measure(args.one, args.devices[0], args.compile[0] == "on", args.warmup,
                         args.iterations, args.precisions[0])  # fmt: skip
        print(json.dumps(result))
        return 0
    import torch

    devices = args.devices or (["cuda", "cpu"] if torch.cuda.is_available() else ["cpu"])
    names = [n for n in cases() if any(n.startswith(c) for c in args.cases)]
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    machine = platform.processor() or platform.machine()
    print(f"{machine}, {os.cpu_count()} CPUs, torch {torch.__version__}, GPU: {gpu}")
    results = []
    for name in names:
        precisions = args.precisions if cases()[name].get("image") else ["float32"]
        for device in devices:
            for precision in precisions:
                if precision == "float16" and device == "cpu":
                    continue  # float16 autocast trains on CUDA only
                for mode in args.compile:
                    result = run_in_subprocess(name, device, mode == "on", precision, args)
                    results.append(result)
                    print(_line(result), flush=True)
    print(_table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


def _line(r: dict) -> str:
    label = (
        f"{r['case']:<20} {r['device']:<5} {r['precision']:<8}"
        f" compile {'on ' if r['compile'] else 'off'}"
    )
    if "error" in r:
        return f"{label}  failed: {r['error']}"
    extra = [f"{r['env_steps_per_s']:,.0f} env steps/s"]
    if r["updates_per_s"]:
        extra.append(f"{r['updates_per_s']:,.1f} updates/s")
    return (
        f"{label}  {r['value']:>10,.0f} {r['figure']:<11}"
        f" ({', '.join(extra)}; start-up {r['startup_s']:.1f} s)"
    )


def _table(results: list[dict]) -> str:
    rows = [
        "",
        "| case | device | precision | compile | figure | start-up s | target |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if "error" in r:
            rows.append(
                f"| {r['case']} | {r['device']} | {r['precision']} | {r['compile']} | failed | | |"
            )
            continue
        unit, goal = TARGETS.get(r["case"], ("", None))
        target = ""
        if goal is not None and r["device"] == "cuda":
            target = f">= {goal:,.0f} {unit}: {'PASS' if r['value'] >= goal else 'FAIL'}"
        rows.append(
            f"| {r['case']} | {r['device']} | {r['precision']} | "
            f"{'on' if r['compile'] else 'off'} | {r['value']:,.0f} {r['figure']} | "
            f"{r['startup_s']:.1f} | {target} |"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
