"""``shoal report DIR``: the runs of an experiment (or any directory of runs) aggregated by
variant: final-score tables with bootstrap confidence intervals, probabilities of
improvement between variants, and learning curves with confidence bands against env steps
and against wall-clock.

A run's score is its evaluation return (``eval/return`` in ``metrics.jsonl``; per agent and
group as ``eval/return/<name>`` for multi-agent runs); its final score is the last one.
Runs are grouped into variants by the experiment's plan (``experiment.json``), or else by
algorithm and env. Per variant: mean, median and interquartile mean of the final scores,
each with a 95% percentile-bootstrap interval (`shoal.core.stats`; one task, so the stratified
bootstrap of Agarwal et al. 2021 is the plain one over runs), the optimality gap to the
runs' ``target_return`` when they have one, and for every pair of variants the probability
that a run of one scores higher than a run of the other (ties count half). Curves: each
run's evaluations interpolated onto a common grid, the mean over runs with a bootstrap band.

Writes ``DIR/report/`` (``scores.md``, ``scores.csv``, ``improvement.csv``,
``curves_steps.png``/``.svg``, ``curves_wall.png``/``.svg``, and per-agent curves for
multi-agent runs) and returns the tables.
"""

from __future__ import annotations

import csv
import importlib.util
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from shoal.core.errors import ShoalError
from shoal.core.stats import bootstrap_ci, iqm


@dataclass
class Run:
    name: str
    variant: str
    steps: np.ndarray
    """Env steps of the evaluations."""
    wall: np.ndarray
    """Training wall-clock (s) at the evaluations (the iterations' times summed)."""
    scores: dict[str, np.ndarray] = field(default_factory=dict)
    """``eval/return`` (key ``""``) and per agent or group (``eval/return/<name>``)."""
    target: float | None = None
    env: str = ""


def read_run(run_dir: Path, variant: str) -> Run | None:
    """A run's evaluations from its ``metrics.jsonl``; None when it has none."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return None
    steps: list[int] = []
    wall: list[float] = []
    scores: dict[str, list[float]] = {}
    elapsed = 0.0
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut off by a crash
        elapsed += float(row.get("perf/iteration_s", 0.0))
        if "eval/return" not in row:
            continue
        steps.append(row["step"])
        wall.append(elapsed)
        for key, value in row.items():
            if key == "eval/return" or key.startswith("eval/return/"):
                scores.setdefault(key.removeprefix("eval/return").lstrip("/"), []).append(value)
    if not steps:
        return None
    config = _json(run_dir / "config.json")
    target = (config.get("run") or {}).get("target_return")
    env = str((config.get("env") or {}).get("id", ""))
    count = len(steps)
    return Run(
        run_dir.name, variant, np.array(steps, np.float64), np.array(wall),
        {k: np.array(v, np.float64) for k, v in scores.items() if len(v) == count}, target, env,
    )  # fmt: skip


def _json(path: Path) -> dict[str, Any]:
    """A run's JSON file as a dict; {} where it is missing or unreadable (cut short by a
    crash, damaged): a report reads what it can, as ``shoal eval`` falls back."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _variant(run_dir: Path) -> str:
    """A plain run's variant: its algorithm (from the newest readable checkpoint metadata)
    and env, else its directory's name."""
    env = (_json(run_dir / "config.json").get("env") or {}).get("id", "")
    algo = ""
    for meta in sorted(run_dir.glob("checkpoints/step_*/meta.json"), reverse=True):
        algo = str(_json(meta).get("algo", ""))
        if algo:
            break
    return f"{algo} {env}".strip() or run_dir.name


def collect(directory: Path) -> list[Run]:
    """The runs under ``directory``, each with its variant; ``directory`` may be one run."""
    plan = directory / "experiment.json"
    runs = []
    if plan.exists():
        for entry in json.loads(plan.read_text())["runs"]:
            run = read_run(directory / entry["name"], entry["variant"])
            if run is not None:
                runs.append(run)
        return runs
    if (directory / "metrics.jsonl").exists():  # a run directory itself
        run = read_run(directory, _variant(directory))
        return [] if run is None else [run]
    for config in sorted(directory.glob("*/config.json")):  # plain runs: by algorithm and env
        run = read_run(config.parent, _variant(config.parent))
        if run is not None:
            runs.append(run)
    return runs


def probability_of_improvement(x: np.ndarray, y: np.ndarray) -> float:
    """P(a run of X scores higher than a run of Y), ties counting half (the Mann-Whitney
    statistic over ``len(x) * len(y)`` pairs)."""
    x, y = np.asarray(x, np.float64)[:, None], np.asarray(y, np.float64)[None, :]
    return float(((x > y) + 0.5 * (x == y)).mean())


MIN_RUNS = 3
"""Fewer runs per variant than this and the report prints no intervals and no
probabilities of improvement: a bootstrap over 2 runs is their min-max, not a 95%
interval."""
METHOD = (
    "Intervals: 95% percentile bootstrap over runs (10,000 resamples; one task, so the "
    "stratified bootstrap of Agarwal et al. 2021 is the plain one), shown for variants with "
    f"at least {MIN_RUNS} runs. P(X > Y), for variants on the same env: the share of (run "
    "of X, run of Y) pairs where X scores higher, ties counting half."
)


def score_table(runs: list[Run], key: str = "") -> list[dict[str, Any]]:
    """Per variant: final-score statistics, with 95% bootstrap intervals where it has at
    least `MIN_RUNS` runs (else the ``_low``/``_high`` entries are absent), and the
    optimality gap where every run has a target return (each run against its own)."""
    rows = []
    for variant in dict.fromkeys(r.variant for r in runs):
        mine = [r for r in runs if r.variant == variant and key in r.scores]
        if not mine:
            continue
        finals = np.array([r.scores[key][-1] for r in mine])
        row: dict[str, Any] = {"variant": variant, "runs": len(finals)}
        for name, statistic in (("mean", np.mean), ("median", np.median), ("iqm", iqm)):
            row[name] = float(statistic(finals))
            if len(finals) >= MIN_RUNS:
                row[f"{name}_low"], row[f"{name}_high"] = bootstrap_ci(finals, statistic)
        targets = [r.target for r in mine]
        if all(t is not None for t in targets):
            gap = np.maximum(np.array(targets, np.float64) - finals, 0.0)
            row["optimality_gap"] = float(gap.mean())
        elif any(t is not None for t in targets):
            row["note"] = (f"{sum(t is not None for t in targets)} of {len(targets)} runs have a "
                           "target return: no optimality gap")  # fmt: skip
        row["steps"] = float(np.mean([r.steps[-1] for r in mine]))
        row["wall_s"] = float(np.mean([r.wall[-1] for r in mine]))
        rows.append(row)
    return rows


def improvement_table(runs: list[Run]) -> list[dict[str, Any]]:
    """P(X > Y) for every ordered pair of variants that both have `MIN_RUNS` runs on the
    same env (returns of different envs are not on one scale)."""
    variants = list(dict.fromkeys(r.variant for r in runs))
    finals = {v: np.array([r.scores[""][-1] for r in runs if r.variant == v]) for v in variants}
    env = {v: next((r.env for r in runs if r.variant == v and r.env), "") for v in variants}
    enough = [v for v in variants if len(finals[v]) >= MIN_RUNS]
    return [
        {"x": x, "y": y, "p_x_better": probability_of_improvement(finals[x], finals[y])}
        for x, y in itertools.permutations(enough, 2)
        if env[x] == env[y]
    ]


def curve(runs: list[Run], key: str, axis: str, points: int = 50):
    """The grid, the mean over runs and its bootstrap band of ``key``'s evaluations on
    ``points`` points of ``axis`` (``steps`` or ``wall``), from the latest first evaluation
    to the last run's end: every run counts at every point, each run's evaluations
    interpolated linearly, and a run that ended earlier (it reached its target, say) holding
    its final score from its end on. The band is None below `MIN_RUNS` runs."""
    end = max(getattr(r, axis)[-1] for r in runs)
    start = max(getattr(r, axis)[0] for r in runs)
    grid = np.linspace(start, end, points) if end > start else np.array([end])
    values = np.stack([np.interp(grid, getattr(r, axis), r.scores[key]) for r in runs])
    if len(runs) < MIN_RUNS:
        return grid, values.mean(0), None, None
    bands = [bootstrap_ci(values[:, i], resamples=500) for i in range(len(grid))]
    return grid, values.mean(0), np.array([b[0] for b in bands]), np.array([b[1] for b in bands])


def plot(runs: list[Run], key: str, axis: str, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    held = False
    for variant in dict.fromkeys(r.variant for r in runs):
        mine = [r for r in runs if r.variant == variant and key in r.scores]
        if not mine:
            continue
        grid, mean, low, high = curve(mine, key, axis)
        ends = [getattr(r, axis)[-1] for r in mine]
        held |= min(ends) < max(ends)
        label = f"{variant} ({len(mine)} run{'s' if len(mine) > 1 else ''}"
        label += ")" if low is not None else f"; no band below {MIN_RUNS})"
        ax.plot(grid, mean, label=label)
        if low is not None:
            ax.fill_between(grid, low, high, alpha=0.2)
    ax.set_xlabel("env steps" if axis == "steps" else "training wall-clock (s)")
    ax.set_ylabel("evaluation return (mean over runs, 95% CI)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    if held:
        fig.text(0.01, 0.01, "runs that ended earlier (at their target, say) hold their final "
                 "score from their end on", fontsize=7)  # fmt: skip
    fig.tight_layout()
    for suffix in (".png", ".svg"):
        fig.savefig(path.with_suffix(suffix), dpi=100)
    plt.close(fig)


def markdown(rows: list[dict[str, Any]]) -> str:
    """The score table; a variant below `MIN_RUNS` runs shows its statistics without
    intervals, and a footnote says why."""
    lines = ["| variant | runs | mean [95% CI] | median [95% CI] | IQM [95% CI] | optimality gap "
             "| env steps | training wall-clock |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    notes = []
    for r in rows:
        cells = [f"{r[k]:.2f} [{r[k + '_low']:.2f}, {r[k + '_high']:.2f}]" if k + "_low" in r
                 else f"{r[k]:.2f} [n/a]" for k in ("mean", "median", "iqm")]  # fmt: skip
        gap = f"{r['optimality_gap']:.2f}" if "optimality_gap" in r else ""
        lines.append(f"| {r['variant']} | {r['runs']} | {' | '.join(cells)} | {gap} | "
                     f"{r['steps']:,.0f} | {r['wall_s']:.0f} s |")  # fmt: skip
        if "mean_low" not in r:
            notes.append(f"{r['variant']}: {r['runs']} run(s), fewer than {MIN_RUNS}: no "
                         "interval (a bootstrap over so few runs is their range, not a 95% "
                         "CI)")  # fmt: skip
        if "note" in r:
            notes.append(f"{r['variant']}: {r['note']}")
    return "\n".join(lines) + "\n" + "".join(f"\n- {n}" for n in notes) + ("\n" if notes else "")


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    names = list(dict.fromkeys(k for r in rows for k in r))
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, names)
        writer.writeheader()
        writer.writerows(rows)


def report(directory: str | Path, out: str | Path | None = None, plots: bool = True) -> dict:
    """Aggregate the runs under ``directory`` into ``out`` (default ``directory/report``);
    returns ``{"scores": rows, "improvement": rows, "agents": {name: rows}}``."""
    directory = Path(directory)
    if plots and importlib.util.find_spec("matplotlib") is None:
        raise ShoalError(
            "shoal report draws its curves with matplotlib: pip install 'shoal[report]'"
        )
    runs = collect(directory)
    if not runs:
        raise ShoalError(
            f"no runs with evaluations (eval/return in metrics.jsonl) under {directory}"
        )
    for variant in dict.fromkeys(r.variant for r in runs):
        envs = sorted({r.env for r in runs if r.variant == variant and r.env})
        if len(envs) > 1:
            raise ShoalError(
                f"variant {variant!r} mixes runs of different envs ({', '.join(envs)}): "
                "their scores cannot be aggregated; report each env's runs apart"
            )
    out = Path(out) if out else directory / "report"
    out.mkdir(parents=True, exist_ok=True)
    scores = score_table(runs)
    improvement = improvement_table(runs)
    names = sorted({k for r in runs for k in r.scores if k})
    agents = {name: score_table(runs, name) for name in names}
    per_agent = "".join(f"\n{name}\n\n{markdown(rows)}" for name, rows in agents.items())
    (out / "scores.md").write_text(markdown(scores) + per_agent + f"\n{METHOD}\n")
    write_csv(scores, out / "scores.csv")
    write_csv(improvement, out / "improvement.csv")
    if plots:
        plot(runs, "", "steps", out / "curves_steps", directory.name)
        plot(runs, "", "wall", out / "curves_wall", directory.name)
        for name in names:
            plot(runs, name, "steps", out / f"curves_steps_{name}", f"{directory.name}: {name}")
    return {"scores": scores, "improvement": improvement, "agents": agents, "out": out,
            "method": METHOD}  # fmt: skip
