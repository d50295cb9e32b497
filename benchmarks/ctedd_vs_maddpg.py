"""CTEDD against MADDPG on the four particle tasks of Chen 2019 ("A New Framework for
Multi-Agent Reinforcement Learning"), its Figures 4 and 5, shortened.

For every task (CN-V1, CN-V2, Push Forward, Predator-Prey) and seed:

* one CTEDD run (`shoal.train("ctedd", ...)`) that yields three learning curves from the same
  env samples: CTEDD-G (the deterministic global policies on the state), CTEDD-L-1 and
  CTEDD-L-3 (local policies distilled with 1- and 3-dim messages, ``message_dim: 1`` and
  ``extra_message_dims: [3]``), evaluated at each distillation round;
* MADDPG-1 and MADDPG-3: shoal's MADDPG with continuous actions and the env's 1- or 3-dim
  message channel (``env.kwargs message_dim``), critics on the global state, evaluated by the
  training loop.

Every curve point is the mean per-agent return of the deterministic policy over
``--eval-episodes`` evaluation episodes (the paper: 400 episodes every 10k samples). Both
algorithms use the paper's section 5.2 settings where it gives them (batch 1024, gamma 0.95,
64-unit networks, lr 0.005 for CTEDD and 0.01 for MADDPG) and the same cadence (8 envs x 4
steps per iteration, 4 gradient steps per iteration).

Budget (default): 30k env steps per run, evaluation every 10k steps on 50 episodes, 3 seeds:
4 tasks x 3 seeds x 3 runs = 36 runs of about 45-90 s each on one core, about 45 minutes in
all on a 2-core machine (one thread per run, runs in sequence). The paper trains for millions
of steps; at this budget only the early part of its curves is reproduced.

Output: per task and series, the final return's mean with a 95% confidence interval
(t-distribution over seeds), how far the curves are from level (the mean change of the
return over the last 20% of the steps, with its interval), whether the paper's ordering
CTEDD-G >= CTEDD-L-m >= MADDPG-m (m = 1, 3, on the means) holds, and a PNG of the learning
curves (mean and 95% CI).

Usage: ``python benchmarks/ctedd_vs_maddpg.py [--seeds 3] [--steps 30000] [--json out.json]
[--plot curves.png] [--quick]`` (``pip install -e '.[bench]'`` for matplotlib). ``--quick``:
a smoke run (2 seeds, 2k steps, evaluation every 1k steps on 4 episodes, small batches).

``--experiment DIR`` trains nothing: it reads the curves of a ``shoal experiment`` directory
whose CTEDD and MADDPG runs are on these tasks (``experiments/chen_ctedd_10_seeds.yaml``: long
comparisons go through ``shoal experiment``, which resumes after a kill) and prints the same
table, plus whether each step of the ordering holds with separated 95% intervals.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import shoal
from shoal.core.stats import t_interval

TASKS = {
    "CN-V1": "shoal/cn-v1-v0",
    "CN-V2": "shoal/cn-v2-v0",
    "PF": "shoal/push-forward-v0",
    "PP": "shoal/predator-prey-v0",
}
SERIES = ("CTEDD-G", "CTEDD-L-1", "CTEDD-L-3", "MADDPG-1", "MADDPG-3")
CTEDD_KEYS = {
    "CTEDD-G": "eval/global_return",
    "CTEDD-L-1": "eval/local_return_m1",
    "CTEDD-L-3": "eval/local_return_m3",
}


def common(args: argparse.Namespace, env_id: str, seed: int, run_dir: Path) -> dict[str, Any]:
    return {
        "run.seed": seed,
        "run.total_steps": args.steps,
        "run.run_dir": str(run_dir),
        "run.console": False,
        "run.tensorboard": False,
        "run.torch_threads": 1,
        "run.eval_episodes": args.eval_episodes,
        "env.id": env_id,
        "env.num_envs": 8,
        "rollout_steps": 4,
        "replay.gradient_steps": 4,
        "replay.batch_size": args.batch_size,
        "replay.learning_starts": min(1024, args.steps // 4),
    }


def run_ctedd(args, env_id: str, seed: int, run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    curves: dict[str, list[tuple[int, float]]] = {name: [] for name in CTEDD_KEYS}

    def record(step: int, metrics: dict[str, float]) -> None:
        for name, key in CTEDD_KEYS.items():
            if key in metrics:
                curves[name].append((step, metrics[key]))

    overrides = common(args, env_id, seed, run_dir)
    overrides.update({
        "env.kwargs": {"continuous": True},
        "message_dim": 1,
        "extra_message_dims": (3,),
        "distill_every": args.eval_every,
        "distill_batch_size": args.batch_size,
        "run.eval_every_steps": 0,
    })  # fmt: skip
    shoal.train("ctedd", on_iteration=record, **overrides)
    return curves


def run_maddpg(args, env_id: str, seed: int, message_dim: int, run_dir: Path):
    curve: list[tuple[int, float]] = []

    def record(step: int, metrics: dict[str, float]) -> None:
        if "eval/return" in metrics:
            curve.append((step, metrics["eval/return"]))

    overrides = common(args, env_id, seed, run_dir)
    overrides.update({
        "env.kwargs": {"continuous": True, "message_dim": message_dim},
        "critic_input": "state",
        "optim.lr": 0.01,
        "actor_lr": 0.01,
        "run.eval_every_steps": args.eval_every,
    })  # fmt: skip
    shoal.train("maddpg", on_iteration=record, **overrides)
    return curve


def summarize(curves: dict[str, dict[str, list[list[tuple[int, float]]]]]) -> dict[str, Any]:
    """Per task and series: the final return's mean and 95% t-interval over seeds; per
    message size m with both CTEDD-L-m and MADDPG-m: whether CTEDD-G >= CTEDD-L-m >= MADDPG-m
    holds on the means (``ordering_holds``) and with separated intervals (``separated``: each
    lower bound above the next series' upper bound)."""
    table: dict[str, Any] = {}
    for task, series in curves.items():
        row = {}
        for name, runs in series.items():
            finals = [run[-1][1] for run in runs if run]
            if finals:
                mean, half = t_interval(finals)
                rise, rise_half = t_interval([late_rise(run) for run in runs if run])
                row[name] = {"mean": mean, "ci95": half, "finals": finals,
                             "late_rise": rise, "late_rise_ci95": rise_half}  # fmt: skip
        ordering, separated = {}, {}
        for m in (1, 3):
            chain = [row.get(name) for name in ("CTEDD-G", f"CTEDD-L-{m}", f"MADDPG-{m}")]
            if any(entry is None for entry in chain):
                continue
            pairs = list(zip(chain, chain[1:], strict=False))
            ordering[f"m{m}"] = all(a["mean"] >= b["mean"] for a, b in pairs)
            separated[f"m{m}"] = all(
                a["mean"] - a["ci95"] > b["mean"] + b["ci95"] for a, b in pairs
            )
        table[task] = {"series": row, "ordering_holds": ordering, "separated": separated}
    return table


def late_rise(curve: list[tuple[int, float]], fraction: float = 0.2) -> float:
    """How far a curve is from level: its final value less its value ``fraction`` of the
    budget earlier (the last evaluation at or before that step; the first one if none)."""
    final_step, final = curve[-1]
    before = [value for step, value in curve if step <= final_step * (1 - fraction)]
    return final - (before[-1] if before else curve[0][1])


def read_experiment(directory: Path) -> dict[str, dict[str, list]]:
    """The curves of a ``shoal experiment`` directory's finished CTEDD and MADDPG runs, by
    task and series (CTEDD-G/-L-m from a CTEDD run's round evaluations, MADDPG-m from a
    MADDPG run's ``eval/return``, m its env's message size)."""
    tasks = {env_id: task for task, env_id in TASKS.items()}
    status = json.loads((directory / "status.json").read_text())
    curves: dict[str, dict[str, list]] = {}
    for entry in json.loads((directory / "experiment.json").read_text())["runs"]:
        if status.get(entry["name"], {}).get("state") != "done":
            continue
        run_dir = directory / entry["name"]
        config = json.loads((run_dir / "config.json").read_text())
        task = tasks.get(config["env"]["id"])
        if task is None or entry["algo"] not in ("ctedd", "maddpg"):
            continue
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        if entry["algo"] == "ctedd":
            keys = CTEDD_KEYS
        else:
            m = (config["env"].get("kwargs") or {}).get("message_dim", 0)
            keys = {f"MADDPG-{m}": "eval/return"}
        for name, key in keys.items():
            curve = [(row["step"], row[key]) for row in rows if key in row]
            curves.setdefault(task, {}).setdefault(name, []).append(curve)
    return curves


def plot(curves, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is missing (pip install -e '.[bench]'): no plot written")
        return False
    fig, axes = plt.subplots(1, len(curves), figsize=(4.5 * len(curves), 3.6), squeeze=False)
    for ax, (task, series) in zip(axes[0], curves.items(), strict=True):
        for name, runs in series.items():
            length = min(len(run) for run in runs)
            if length == 0:
                continue
            steps = [step for step, _ in runs[0][:length]]
            values = np.array([[v for _, v in run[:length]] for run in runs])
            stats = [t_interval(list(values[:, i])) for i in range(length)]
            mean = np.array([s[0] for s in stats])
            half = np.nan_to_num(np.array([s[1] for s in stats]))
            ax.plot(steps, mean, label=name)
            ax.fill_between(steps, mean - half, mean + half, alpha=0.2)
        ax.set_title(task)
        ax.xaxis.set_major_formatter(lambda x, _: f"{x / 1000:g}k")
        ax.set_xlabel("env steps")
        ax.set_ylabel("evaluation return (per agent)")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def train_all(args: argparse.Namespace) -> dict[str, dict[str, list]]:
    """Train every task x seed x series here, one run at a time."""
    curves: dict[str, dict[str, list]] = {t: {s: [] for s in SERIES} for t in args.tasks}
    with tempfile.TemporaryDirectory() as tmp:
        for task in args.tasks:
            env_id = TASKS[task]
            for seed in range(args.seeds):
                t0 = time.perf_counter()
                base = Path(tmp) / f"{task}-{seed}"
                for name, curve in run_ctedd(args, env_id, seed, base / "ctedd").items():
                    curves[task][name].append(curve)
                for m in (1, 3):
                    curve = run_maddpg(args, env_id, seed, m, base / f"maddpg{m}")
                    curves[task][f"MADDPG-{m}"].append(curve)
                finals = {n: round(c[-1][-1][1], 2) for n, c in curves[task].items() if c[-1]}
                print(f"{task} seed {seed} ({time.perf_counter() - t0:.0f} s): {finals}")
    return curves


def print_table(args: argparse.Namespace, table: dict[str, Any], seconds: float) -> bool:
    """The final-return table; returns whether the ordering holds on the means everywhere."""
    print(f"\nfinal evaluation return at {args.steps} env steps, mean +- 95% CI over "
          f"{args.seeds} seeds ({seconds:.0f} s in all)")  # fmt: skip
    print(f"{'task':<7}" + "".join(f"{name:>20}" for name in SERIES) + "   G >= L >= MADDPG")
    for task, entry in table.items():
        cells = "".join(
            f"{entry['series'][n]['mean']:>11.2f} +- {entry['series'][n]['ci95']:<5.2f}"
            if n in entry["series"]
            else f"{'-':>20}"
            for n in SERIES
        )
        holds = ", ".join(
            f"{m}: {'yes' if ok else 'no'} (intervals "
            f"{'separated' if entry['separated'][m] else 'overlap'})"
            for m, ok in entry["ordering_holds"].items()
        )
        print(f"{task:<7}{cells}   {holds}")
        rises = "".join(
            f"{series[n]['late_rise']:>+11.2f} +- {series[n]['late_rise_ci95']:<5.2f}"
            if n in (series := entry["series"])
            else f"{'-':>20}"
            for n in SERIES
        )
        print(f"{'  rise':<7}{rises}   (change over the last 20% of the steps)")
    all_hold = all(all(e["ordering_holds"].values()) for e in table.values())
    print(f"paper's ordering CTEDD-G >= CTEDD-L >= MADDPG holds on every task: {all_hold}")
    return all_hold


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30_000)
    parser.add_argument("--eval-every", type=int, default=10_000)
    parser.add_argument("--eval-episodes", type=int, default=50)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--plot", type=Path, default=Path("ctedd_vs_maddpg.png"))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--experiment", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.steps, args.eval_every = 2, 2_000, 1_000
        args.eval_episodes, args.batch_size = 4, 64
    start = time.perf_counter()
    if args.experiment is not None:
        curves = read_experiment(args.experiment)
        every = [runs for series in curves.values() for runs in series.values()]
        counts = sorted({len(runs) for runs in every}) or [0]
        args.seeds = str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
        args.steps = max((run[-1][0] for runs in every for run in runs if run), default=0)
    else:
        curves = train_all(args)
    table = summarize(curves)
    all_hold = print_table(args, table, time.perf_counter() - start)
    if plot(curves, args.plot):
        print(f"learning curves: {args.plot}")
    if args.json is not None:
        args.json.write_text(json.dumps({
            "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "table": table,
            "ordering_holds_everywhere": all_hold,
            "curves": curves,
        }, indent=2))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
