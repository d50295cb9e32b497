"""shoal against the fastest RL libraries at equal settings: training env-steps/s (frames/s
on Pong, updates/s for SAC) and wall-clock to solve, medians over seeds, in one run.

Rows (settings in ``peer_settings.ROWS``): PPO on CartPole-v1 with rl-baselines3-zoo's
settings, PPO on Pong (8 envs, Nature CNN, float32), SAC on HalfCheetah-v5 (256-256, batch
256) and DQN on CartPole-v1 with the zoo's settings. Libraries: shoal, Stable-Baselines3,
TorchRL, Tianshou and, on Pong, Sample Factory's APPO; each in its own virtual environment
where its pins conflict with shoal's (``make bench-peers`` creates them), each written as the
library's own examples train. Every measurement is a fresh process running a side script
(``peer_<library>.py``), one torch thread for every library; seeds are interleaved and the
order of the libraries rotates from seed to seed. shoal's Pong row also runs APPO
(sampling in a thread during the update) and both with two torch threads, and Sample
Factory runs its own processes (2 rollout workers, inference, learner): those rows use the
second core and are reported apart from the one-thread comparison.

PufferLib and EnvPool: PufferLib 3.0's build downloads raylib from GitHub (no network here)
and its NO_OCEAN switch fails with a NameError in 3.0.0's setup.py, so it is not installed;
EnvPool has a wheel (1.2.5) but no library here runs on it, and the rows compare libraries on
their own env pipelines.

Usage: ``python benchmarks/peers.py [--seeds 3] [--rows ppo-cartpole ...] [--libraries
shoal sb3 ...] [--modes throughput solve] [--json F]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

LIBRARIES: dict[str, dict[str, Any]] = {
    "shoal": {"python": ".venv/bin/python", "script": "peer_shoal.py"},
    "sb3": {"python": ".venv/bin/python", "script": "peer_sb3.py"},
    "torchrl": {"python": ".venv-torchrl/bin/python", "script": "peer_torchrl.py"},
    "tianshou": {"python": ".venv-tianshou/bin/python", "script": "peer_tianshou.py"},
    "sample-factory": {"python": ".venv-sf/bin/python", "script": "peer_sample_factory.py",
                       "rows": ("ppo-pong",)},
}  # fmt: skip

# (row, mode, metric): what each row measures.
MEASURES = [
    ("ppo-cartpole", "throughput", "env_steps_per_s"),
    ("ppo-cartpole", "solve", "solve_s"),
    ("ppo-pong", "throughput", "frames_per_s"),
    ("sac-halfcheetah", "throughput", "updates_per_s"),
    ("dqn-cartpole", "throughput", "env_steps_per_s"),
    ("dqn-cartpole", "solve", "solve_s"),
]
# shoal's extra Pong configurations: APPO, and both with a second torch thread.
SHOAL_PONG_VARIANTS = ("appo", "ppo-2t", "appo-2t")


def run_side(library: str, row: str, mode: str, seed: int, variant: str | None) -> dict:
    spec = LIBRARIES[library]
    command = [str(ROOT / spec["python"]), str(HERE / spec["script"]), "--row", row,
               "--mode", mode, "--seed", str(seed)]  # fmt: skip
    if variant:
        command += ["--variant", variant]
    done = subprocess.run(command, capture_output=True, text=True, cwd=HERE, timeout=1800)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"error": (done.stderr or done.stdout)[-1500:]}
    result = json.loads(lines[-1])
    if "frames_per_s" not in result and "env_steps_per_s" in result and row == "ppo-pong":
        result["frames_per_s"] = 4 * result["env_steps_per_s"]
    return result


def entries(libraries: list[str], row: str) -> list[tuple[str, str | None]]:
    out: list[tuple[str, str | None]] = []
    for library in libraries:
        if row not in LIBRARIES[library].get("rows", (row,)):
            continue
        out.append((library, None))
        if library == "shoal" and row == "ppo-pong":
            out += [("shoal", variant) for variant in SHOAL_PONG_VARIANTS]
    return out


def label(library: str, variant: str | None) -> str:
    return library if variant is None else f"{library} {variant}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--rows", nargs="*", default=sorted({m[0] for m in MEASURES}))
    parser.add_argument("--libraries", nargs="*", default=list(LIBRARIES))
    parser.add_argument("--modes", nargs="*", default=["throughput", "solve"])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    libraries = [lib for lib in args.libraries if (ROOT / LIBRARIES[lib]["python"]).exists()]
    missing = sorted(set(args.libraries) - set(libraries))
    if missing:
        print(f"not installed (make bench-peers creates them): {', '.join(missing)}", flush=True)
    results: dict[str, dict[str, list[dict]]] = {}
    started = time.perf_counter()
    for seed in range(args.seeds):
        for row, mode, metric in MEASURES:
            if row not in args.rows or mode not in args.modes:
                continue
            order = entries(libraries, row)
            shift = seed % len(order)
            for library, variant in order[shift:] + order[:shift]:
                if variant is not None and mode != "throughput":
                    continue
                out = run_side(library, row, mode, seed, variant)
                key = f"{row} {mode}"
                results.setdefault(key, {}).setdefault(label(library, variant), []).append(out)
                shown = out.get(metric, out.get("error", "")[-200:])
                print(f"[{time.perf_counter() - started:6.0f} s] seed {seed} {key:28s} "
                      f"{label(library, variant):18s} {metric} {shown}", flush=True)  # fmt: skip
    summary = summarize(results)
    print_table(summary)
    if args.json:
        args.json.write_text(json.dumps({"seeds": args.seeds, "summary": summary,
                                         "runs": results}, indent=2))  # fmt: skip
    return 0


def summarize(results: dict[str, dict[str, list[dict]]]) -> dict[str, dict[str, Any]]:
    metrics = {f"{row} {mode}": metric for row, mode, metric in MEASURES}
    summary: dict[str, dict[str, Any]] = {}
    for key, by_library in results.items():
        metric = metrics[key]
        summary[key] = {}
        for name, runs in by_library.items():
            values = [r[metric] for r in runs if metric in r]
            entry: dict[str, Any] = {"median": statistics.median(values) if values else None,
                                     "values": values,
                                     "version": next((r["version"] for r in runs
                                                      if "version" in r), None)}  # fmt: skip
            if "solve" in key:
                entry["solved"] = sum(bool(r.get("solved")) for r in runs)
                steps = [r["solve_steps"] for r in runs if "solve_steps" in r]
                entry["steps"] = statistics.median(steps) if steps else None
            errors = [r["error"] for r in runs if "error" in r]
            if errors:
                entry["error"] = errors[-1][-400:]
            summary[key][name] = entry
    return summary


def print_table(summary: dict[str, dict[str, Any]]) -> None:
    print("\n| measurement | library | median | per seed | note |\n|---|---|---|---|---|")
    for key, by_library in summary.items():
        lower_is_better = "solve" in key
        ranked = sorted(
            (n for n in by_library if by_library[n]["median"] is not None),
            key=lambda n: by_library[n]["median"] * (1 if lower_is_better else -1),
        )
        for name in ranked + [n for n in by_library if n not in ranked]:
            entry = by_library[name]
            median = entry["median"]
            values = ", ".join(f"{v:,.1f}" for v in entry["values"])
            note = ""
            if "solve" in key:
                runs = len(entry["values"])
                note = f"solved {entry['solved']}/{runs}, median steps {entry.get('steps')}"
            if "error" in entry:
                note += " error: " + entry["error"].strip().splitlines()[-1][:120]
            shown = "-" if median is None else f"{median:,.1f}"
            print(f"| {key} | {name} | {shown} | {values} | {note} |")


if __name__ == "__main__":
    sys.exit(main())
