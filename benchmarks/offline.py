"""Offline RL: IQL, CQL and TD3+BC in shoal and in d3rlpy on the same dataset files.

Both libraries read the same Minari dataset (made by ``shoal collect --recipe NAME``), with
the same networks (256-256 ReLU actor, critics and IQL's value), batch 256, learning rates,
IQL's expectile 0.7 / temperature 3 / weight cap 100, CQL's fixed penalty weight 5 with 10
sampled actions, TD3+BC's alpha 2.5, observations standardized by the dataset's statistics,
one torch thread each, and the same number of updates. Per seed and library: updates per
second of training (evaluation excluded) and the normalized score (0: random, 100: the
dataset's expert) of the final deterministic policy over 10 episodes.

d3rlpy pins gymnasium 1.0, so it runs in its own virtual environment
(``make bench-offline`` builds ``.venv-d3rlpy``) through ``offline_d3rlpy_side.py``.
Published figures to set beside them, for orientation only (D4RL's datasets differ from
shoal's): CORL's D4RL-v2 final scores on halfcheetah-medium, BC 42.4, TD3+BC 48.1, CQL 47.0,
IQL 48.3 (Tarasov et al. 2022, "CORL: research-oriented deep offline reinforcement learning
library").

Usage: ``python benchmarks/offline.py --d3rlpy-python .venv-d3rlpy/bin/python
[--dataset datasets/pendulum-medium] [--updates 2000] [--seeds 3] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import torch

import shoal
from shoal.core.stats import t_interval
from shoal.data.offline import read_dataset, resolve_path

HERE = Path(__file__).parent
ALGOS = {"iql": "iql-offline", "cql": "cql", "td3-bc": "td3-bc"}
SETTINGS = {"replay.batch_size": 256, "run.torch_threads": 1}
EVAL_EPISODES = 10


def shoal_run(
    algo: str, dataset: str, seed: int, updates: int, hidden: list[int]
) -> dict[str, Any]:
    torch.set_num_threads(1)
    data = read_dataset(dataset)
    run_dir = Path(f"runs/bench-offline/{algo}-{seed}")
    shutil.rmtree(run_dir, ignore_errors=True)  # a fresh run each time
    extra = {"action_samples": 10} if algo == "cql" else {}
    result = shoal.train(ALGOS[algo], dataset=dataset, seed=seed, quiet=True,
                         total_steps=updates, run_dir=str(run_dir),
                         **SETTINGS, **extra, **{"model.hidden": tuple(hidden)},
                         **{"run.eval_every_steps": updates,
                            "run.eval_episodes": EVAL_EPISODES})  # fmt: skip
    return {"library": "shoal", "algo": algo, "seed": seed,
            "updates_per_s": updates / result.train_s,
            "score": data.normalized_score(result.eval_return)}  # fmt: skip


def d3rlpy_run(
    python: str, algo: str, dataset: str, seed: int, updates: int, hidden: list[int]
) -> dict[str, Any]:
    args = {"dataset": str(resolve_path(dataset)), "algo": algo, "seed": seed,
            "updates": updates, "hidden": hidden, "batch": 256,
            "eval_episodes": EVAL_EPISODES, "eval_seed": 10_000 + 100 * seed}  # fmt: skip
    out = subprocess.run([python, str(HERE / "offline_d3rlpy_side.py"), json.dumps(args)],
                         capture_output=True, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
    last = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
    if not last.startswith("{"):
        raise RuntimeError(f"d3rlpy failed:\n{(out.stdout + out.stderr)[-3000:]}")
    side = json.loads(last)
    data = read_dataset(dataset)
    return {"library": "d3rlpy", "algo": algo, "seed": seed,
            "updates_per_s": side["updates"] / side["train_s"],
            "score": data.normalized_score(float(np.mean(side["returns"]))),
            "version": side["version"]}  # fmt: skip


def summary(rows: list[dict[str, Any]], algo: str) -> dict[str, Any]:
    out: dict[str, Any] = {"algo": algo}
    for lib in ("shoal", "d3rlpy"):
        mine = [r for r in rows if r["library"] == lib and r["algo"] == algo]
        if not mine:
            continue
        mean, half = t_interval([r["score"] for r in mine])
        out[lib] = {
            "updates_per_s": float(np.median([r["updates_per_s"] for r in mine])),
            "score": mean,
            "score_ci": half,
        }
    if "shoal" in out and "d3rlpy" in out:
        s, d = out["shoal"], out["d3rlpy"]
        out["speedup"] = s["updates_per_s"] / d["updates_per_s"]
        out["score_ok"] = s["score"] >= d["score"] - d["score_ci"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", default="datasets/pendulum-medium")
    parser.add_argument("--algos", nargs="+", default=list(ALGOS), choices=list(ALGOS))
    parser.add_argument("--updates", type=int, default=2000)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--hidden", type=int, nargs="+", default=[256, 256])
    parser.add_argument(
        "--d3rlpy-python", help="the d3rlpy environment's python (omit: shoal only)"
    )
    parser.add_argument("--json", help="write the rows and the summary here")
    args = parser.parse_args()
    rows = []
    for algo in args.algos:
        for seed in range(args.seeds):  # the two libraries interleaved: same machine load
            rows.append(shoal_run(algo, args.dataset, seed, args.updates, args.hidden))
            print(json.dumps(rows[-1]), flush=True)
            if args.d3rlpy_python:
                rows.append(d3rlpy_run(args.d3rlpy_python, algo, args.dataset, seed,
                                       args.updates, args.hidden))  # fmt: skip
                print(json.dumps(rows[-1]), flush=True)
    table = [summary(rows, algo) for algo in args.algos]
    print(f"\n{args.dataset}, {args.updates:,} updates, {args.seeds} seeds, {args.hidden}")
    print("| algo | shoal updates/s | d3rlpy updates/s | speedup | shoal score | d3rlpy score |")
    print("|---|---|---|---|---|---|")
    for t in table:
        s, d = t.get("shoal", {}), t.get("d3rlpy", {})
        fmt = lambda x: f"{x['score']:.1f} ± {x['score_ci']:.1f}" if x else "-"  # noqa: E731
        print(
            f"| {t['algo']} | {s.get('updates_per_s', 0):.1f} | {d.get('updates_per_s', 0):.1f} "
            f"| {t.get('speedup', float('nan')):.2f}x | {fmt(s)} | {fmt(d)} |"
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"dataset": args.dataset, "updates": args.updates, "rows": rows, "summary": table},
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
