"""A solve race: a shoal tuned example against an SB3 zoo configuration, seed by seed.

Shared by the benchmarks whose targets are wall-clock (and optionally env steps) to solve
(`dqn_cartpole.py`, `a2c_cartpole.py`, `sac_pendulum.py`): both libraries train until a
`common.SolveCriterion` is met (`common.CARTPOLE` unless one is passed), seeds interleaved with
the order alternating, and the report gives medians, gradient steps and the per-seed
speed-ups.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import common
from common import (
    CARTPOLE,
    TORCH_THREADS,
    RunRecord,
    SolveCriterion,
    environment,
    median,
    print_checks,
    record_dict,
    run_line,
)

from shoal.api import build_config
from shoal.config import to_dict


@dataclass
class RaceRecord(RunRecord):
    grad_steps: int = 0
    """Gradient steps when solved (or at the end of the budget)."""

    @property
    def grad_steps_per_s(self) -> float:
        return self.grad_steps / self.train_s


def shoal_tuned_run(
    workdir: Path,
    tuned: str,
    seed: int,
    budget: int,
    solve: bool = True,
    criterion: SolveCriterion = CARTPOLE,
) -> RaceRecord:
    """A tuned example; its gradient steps are read from the loop's per-iteration metrics
    (``train/grad_steps`` when the algorithm reports it, else one per iteration), outside the
    timed iterations."""
    grad_steps = iterations = 0
    reported = False

    def on_iteration(steps: int, metrics: dict[str, float]) -> None:
        nonlocal grad_steps, iterations, reported
        iterations += 1
        reported = reported or "train/grad_steps" in metrics
        grad_steps = int(metrics.get("train/grad_steps", grad_steps if reported else iterations))

    record = common.shoal_run(
        workdir,
        "shoal tuned",
        seed,
        budget,
        solve,
        tuned=tuned,
        on_iteration=on_iteration,
        criterion=criterion,
    )
    return RaceRecord(**asdict(record), grad_steps=grad_steps)


def sb3_zoo_run(
    env_id: str,
    make_model: Callable[[int], Any],
    seed: int,
    budget: int,
    criterion: SolveCriterion = CARTPOLE,
) -> RaceRecord:
    """SB3 until solved or ``learn(budget)`` ends (see `common.EvalAndStop`)."""
    record, model = common.sb3_run(
        "sb3 zoo", env_id, make_model, seed, budget, solve=True, criterion=criterion
    )
    return RaceRecord(**asdict(record), grad_steps=int(model._n_updates))


def run_race(
    seeds: int,
    shoal_fn: Callable[[Path, int], RaceRecord],
    sb3_fn: Callable[[int], RaceRecord],
    warm_up: Callable[[Path], None],
    log: Callable[[str], None],
) -> list[RaceRecord]:
    records: list[RaceRecord] = []
    with tempfile.TemporaryDirectory(prefix="shoal-bench-") as tmp:
        workdir = Path(tmp)
        log("warm-up (untimed) ...")
        warm_up(workdir)
        for seed in range(seeds):
            log(f"seed {seed}")
            pair = [lambda s=seed: shoal_fn(workdir, s), lambda s=seed: sb3_fn(s)]
            for measure in pair if seed % 2 == 0 else pair[::-1]:
                record = measure()
                records.append(record)
                log(f"{run_line(record)}  {record.grad_steps:>6} grad steps")
    return records


def summarize(
    records: list[RaceRecord], target_speedup: float, target_steps_ratio: float | None = None
) -> dict[str, Any]:
    """Medians per configuration and the checks: SB3's median solve seconds over shoal's
    >= ``target_speedup``, and, when ``target_steps_ratio`` is given, SB3's median env steps to
    solve over shoal's >= it (1.0: shoal needs no more env steps than SB3). Both checks also
    need every shoal seed solved."""
    rows: dict[str, dict[str, Any]] = {}
    for config in ("shoal tuned", "sb3 zoo"):
        runs = [r for r in records if r.config == config]
        rows[config] = {
            "seeds": len(runs),
            "solved": sum(r.solved for r in runs),
            "median_solve_s": median([r.solve_s for r in runs]),
            "median_solve_steps": median([r.env_steps for r in runs]),
            "median_grad_steps": median([r.grad_steps for r in runs]),
            "median_steps_per_s": median([r.steps_per_s for r in runs]),
            "median_grad_steps_per_s": median([r.grad_steps_per_s for r in runs]),
            "median_setup_s": median([r.setup_s for r in runs]),
        }
    shoal, sb3 = rows["shoal tuned"], rows["sb3 zoo"]
    speedup = sb3["median_solve_s"] / shoal["median_solve_s"]
    checks = {
        "wall_clock_speedup": {
            "description": "sb3 zoo median solve s / shoal tuned median solve s",
            "value": speedup,
            "target": target_speedup,
            # Unsolved shoal seeds would make the ratio look better than it is (an unsolved SB3
            # seed counts its whole budget, which only makes the ratio look worse).
            "pass": speedup >= target_speedup and shoal["solved"] == shoal["seeds"],
        },
    }
    steps_ratio = sb3["median_solve_steps"] / shoal["median_solve_steps"]
    if target_steps_ratio is not None:
        checks["solve_steps_ratio"] = {
            "description": "sb3 zoo median env steps to solve / shoal tuned median",
            "value": steps_ratio,
            "target": target_steps_ratio,
            # An unsolved shoal seed counts its whole budget, but that can still be fewer
            # steps than an SB3 seed that did solve.
            "pass": steps_ratio >= target_steps_ratio and shoal["solved"] == shoal["seeds"],
        }
    extra = {
        "solve_steps_ratio_sb3_over_shoal": steps_ratio,
        "steps_per_s_ratio_shoal_over_sb3": shoal["median_steps_per_s"] / sb3["median_steps_per_s"],
        "per_seed_speedup": [
            b.solve_s / s.solve_s
            for s, b in zip(
                [r for r in records if r.config == "shoal tuned"],
                [r for r in records if r.config == "sb3 zoo"],
                strict=True,
            )
        ],
    }
    return {"rows": rows, "checks": checks, "extra": extra}


def print_report(
    summary: dict[str, Any],
    algo: str,
    env_id: str,
    seeds: int,
    budget: int,
    criterion: SolveCriterion = CARTPOLE,
) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=100)
    table = Table(
        title=f"{algo} {env_id}, {seeds} seed(s), medians; {criterion.describe()}; "
        f"budget {budget:,} env steps"
    )
    for column in ("config", "solved", "solve s", "steps to solve", "grad steps"):
        table.add_column(column, justify="left" if column == "config" else "right")
    table.add_column("env steps/s", justify="right")
    table.add_column("grad steps/s", justify="right")
    for name, row in summary["rows"].items():
        table.add_row(
            name,
            f"{row['solved']}/{row['seeds']}",
            f"{row['median_solve_s']:.2f}",
            f"{row['median_solve_steps']:,.0f}",
            f"{row['median_grad_steps']:,.0f}",
            f"{row['median_steps_per_s']:,.0f}",
            f"{row['median_grad_steps_per_s']:,.0f}",
        )
    console.print(table)
    print_checks(console, summary["checks"])
    extra = summary["extra"]
    per_seed = ", ".join(f"{v:.2f}x" for v in extra["per_seed_speedup"])
    console.print(
        f"also: sb3 zoo / shoal tuned env steps to solve "
        f"{extra['solve_steps_ratio_sb3_over_shoal']:.2f}x; shoal tuned / sb3 zoo training "
        f"env-steps/s {extra['steps_per_s_ratio_shoal_over_sb3']:.2f}x; "
        f"solve-time ratio per seed {per_seed}"
    )
    console.print(
        f"torch threads = {TORCH_THREADS} for both libraries; evaluation time excluded for both; "
        "imports excluded (untimed warm-up); set-up of envs and model included in solve time; "
        "env steps/s = env steps / training seconds (gradient steps included)."
    )


def write_json(
    path: Path,
    benchmark: str,
    settings: dict[str, Any],
    tuned: str,
    summary: dict[str, Any],
    records: list[RaceRecord],
    criterion: SolveCriterion = CARTPOLE,
) -> None:
    payload = {
        "benchmark": benchmark,
        "settings": settings
        | criterion.settings()
        | {
            "shoal_tuned": tuned,
            "shoal_tuned_config": to_dict(build_config(tuned=tuned)),
        },
        "environment": environment(),
        "summary": summary,
        "runs": [record_dict(r) | {"grad_steps_per_s": r.grad_steps_per_s} for r in records],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2))
    print(f"wrote {path}")


def finish(
    started: float,
    summary: dict[str, Any],
    algo: str,
    env_id: str,
    seeds: int,
    budget: int,
    criterion: SolveCriterion = CARTPOLE,
) -> int:
    """Print the report; the exit status: 0 when every target passes, else 1."""
    print()
    print_report(summary, algo, env_id, seeds, budget, criterion)
    print(f"benchmark took {time.perf_counter() - started:.0f} s")
    return 0 if all(c["pass"] for c in summary["checks"].values()) else 1
