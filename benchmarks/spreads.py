"""A tuned example's result as a spread over seeds, not one seed on one CPU.

Each (example, seed) run trains the tuned example as it is (its own budget, target and
evaluations) with ``run.seed`` set, then evaluates the final policy afresh on its own seed
(``--fresh-episodes`` episodes, `shoal.evaluate`). The table gives, per example: how many
seeds met the example's ``run.target_return`` (where it has one), the env steps at which they
stopped, the last training evaluation and the fresh evaluation, each as median [min, max];
and the CPU it ran on. Results are appended to ``--json`` as each run ends, and runs already
there are not run again, so a killed sweep resumes where it stopped.

Usage: ``python benchmarks/spreads.py sac-pendulum d4pg-pendulum --seeds 5
--json benchmarks/results/spreads.json [--set replay.n_step=3]``. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

import shoal
from shoal.registry import find_tuned, get_algorithm

QUIET = {"run.console": False, "run.tensorboard": False}
FRESH_SEED = 2024
GAMES_PER_SEAT = 200


def cpu_name() -> str:
    """The CPU's model name (Linux), else the platform's processor string."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


class OwnScores:
    """A training callback keeping a planner's ``episode/return`` (mcts: its planned
    episodes are its evaluation; it holds no policy to evaluate afresh) and the last
    value of each evaluation metric an algorithm logs itself (CTEDD's global and local
    policies)."""

    def __init__(self) -> None:
        self.returns: list[float] = []
        self.evaluation: dict[str, float] = {}

    def on_iteration(self, metrics: dict) -> None:
        if "episode/return" in metrics:
            self.returns.append(float(metrics["episode/return"]))
        self.evaluation.update({k: float(v) for k, v in metrics.items() if k.startswith("eval/")})


def run_one(example: str, seed: int, fresh_episodes: int, overrides: dict[str, Any]) -> dict:
    own = OwnScores()
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        result = shoal.train(
            tuned=example, seed=seed, run_dir=f"{tmp}/run", **QUIET, **overrides,
            callbacks=[own],
        )  # fmt: skip
        wall = time.perf_counter() - started
        # A planner on the env's own state (mcts) holds no policy to evaluate afresh.
        deploys = get_algorithm(find_tuned(example).algo).deploys
        fresh = (
            shoal.evaluate(result.run_dir, episodes=fresh_episodes, seed=FRESH_SEED)
            if deploys
            else {}
        )
        # A two-seat game one policy plays both seats of (tic-tac-toe's PPO and IPPO): its
        # win rate in each seat against a uniformly random player, as its text states it.
        seats = sorted(fresh.get("outcomes", {}))
        if len(seats) != 2 or "opponents" in fresh:
            seats = []
        versus_random = {
            seat: shoal.evaluate(
                result.run_dir, episodes=GAMES_PER_SEAT, seed=FRESH_SEED,
                fixed={other: "random" for other in seats if other != seat},
            )["outcomes"][seat]["win"]["rate"]
            for seat in seats
        }  # fmt: skip
    return {
        "example": example,
        "seed": seed,
        "overrides": overrides,
        "stop_reason": result.stop_reason,
        "env_steps": result.env_steps,
        "eval_return": _last_score(result) if deploys else _mean(own.returns),
        "fresh_return": _fresh_score(fresh),
        "fresh_groups": {g: v["mean"] for g, v in fresh.get("groups", {}).items()},
        "fresh_wins_vs_random": versus_random,
        "fresh_env_statistics": fresh.get("env_statistics", {}),
        "own_evaluation": own.evaluation,
        "train_s": round(result.train_s, 2),
        "wall_s": round(wall, 2),
        "cpu": cpu_name(),
    }


def _last_score(result: Any) -> float | None:
    """The run's last evaluation: its return, or a game-player's (AlphaZero's) last match
    score against minimax play."""
    if result.eval_return is not None:
        return result.eval_return
    return (result.eval_scores or {}).get("eval/vs_minimax/score")


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _fresh_score(report: dict[str, Any]) -> float | None:
    """``shoal eval``'s mean return (none where groups oppose each other), or a game-player's
    score against minimax play (a draw scores 0.5)."""
    if "return" in report:
        return report["return"]["mean"]
    for name, result in report.get("opponents", {}).items():
        if name.startswith("minimax"):
            return result["score"]
    return None


def spread(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):,.1f} [{min(values):,.1f}, {max(values):,.1f}]"


def table(rows: list[dict]) -> str:
    lines = [
        "| example | overrides | cpu | seeds | met target | env steps | last eval | fresh eval |",
        "|---|---|---|---|---|---|---|---|",
    ]
    keys = sorted({(r["example"], json.dumps(r["overrides"], sort_keys=True), r["cpu"])
                   for r in rows})  # fmt: skip
    for example, overrides, cpu in keys:
        group = [r for r in rows if (r["example"], json.dumps(r["overrides"], sort_keys=True),
                                     r["cpu"]) == (example, overrides, cpu)]  # fmt: skip
        met = sum(r["stop_reason"] == "target_return" for r in group)
        has_target = find_tuned(example).build_config().run.target_return is not None
        cells = [
            example,
            overrides if overrides != "{}" else "",
            cpu,
            ", ".join(str(r["seed"]) for r in sorted(group, key=lambda r: r["seed"])),
            f"{met}/{len(group)}" if has_target else "no target",
            spread([r["env_steps"] for r in group]),
            spread([r["eval_return"] for r in group if r["eval_return"] is not None]),
            spread([r["fresh_return"] for r in group if r["fresh_return"] is not None]),
        ]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("examples", nargs="+", help="tuned example names")
    parser.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--fresh-episodes", type=int, default=10)
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="a config override for every run (dotted field names)",
    )
    parser.add_argument("--json", type=Path, default=Path("benchmarks/results/spreads.json"))
    args = parser.parse_args()
    overrides = {}
    for item in args.set:
        key, _, value = item.partition("=")
        overrides[key.replace("-", "_")] = yaml.safe_load(value)
    rows: list[dict] = json.loads(args.json.read_text()) if args.json.exists() else []
    cpu = cpu_name()
    for example in args.examples:
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            done = any(r["example"] == example and r["seed"] == seed and r["cpu"] == cpu
                       and r["overrides"] == overrides for r in rows)  # fmt: skip
            if done:
                continue
            row = run_one(example, seed, args.fresh_episodes, overrides)
            print(json.dumps(row), flush=True)
            rows.append(row)
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(rows, indent=1) + "\n")
    print(table([r for r in rows if r["example"] in args.examples]))


if __name__ == "__main__":
    main()
