"""``shoal experiment``, ``shoal tune`` and ``shoal report``: many runs, planned, searched and
summed up."""

from __future__ import annotations

import argparse
from typing import Any

from rich.live import Live
from rich.markup import escape
from rich.table import Column, Table

from shoal.cli.shared import console, plain


def add_parsers(commands: Any) -> None:
    experiment_p = commands.add_parser(
        "experiment", help="a grid of configs x seeds, run in parallel (resumable)"
    )
    experiment_p.add_argument("file", help="the experiment's YAML file")
    experiment_p.add_argument("--dir", help="experiment directory (default runs/experiments/NAME)")
    experiment_p.add_argument("--jobs", type=int, help="runs at a time (default: the cores)")
    experiment_p.add_argument("--plan", action="store_true", help="list the runs, run nothing")
    experiment_p.add_argument(
        "--runs", action="append", metavar="GLOB",
        help="run only the runs whose names match (a shell glob: ppo-breakout-*, ppo-pong-s0); "
        "repeatable; the others wait for a later start",
    )  # fmt: skip
    experiment_p.add_argument(
        "--retries", type=int, default=2,
        help="start a run that crashed again (from its checkpoint) up to this many times",
    )  # fmt: skip
    experiment_p.add_argument(
        "--ray-address",
        help="run each run as a Ray task: 'auto' or HOST:PORT joins a cluster (the directory "
        "must be shared storage), 'local' starts a Ray here",
    )
    experiment_p.set_defaults(run=_experiment)
    tune_p = commands.add_parser("tune", help="hyperparameter search with Optuna (resumable)")
    tune_p.add_argument("file", help="the search's YAML file")
    tune_p.add_argument("--dir", help="study directory (default runs/tune/NAME)")
    tune_p.add_argument(
        "--jobs", type=int, help="workers on the study (default 1; with --ray-address the CPUs)"
    )
    tune_p.add_argument(
        "--ray-address",
        help="run the workers as Ray tasks: 'auto' or HOST:PORT joins a cluster, 'local' "
        "starts a Ray here (the study must be reachable from every node: see --storage)",
    )
    tune_p.add_argument(
        "--storage",
        help="Optuna storage URL for the study (default sqlite in --dir; e.g. postgresql://"
        "user@host/db on a cluster)",
    )
    tune_p.set_defaults(run=_tune)
    report_p = commands.add_parser(
        "report", help="aggregate runs by variant: scores with 95%% CIs, curves, comparisons"
    )
    report_p.add_argument("dir", help="an experiment directory, a directory of runs, or one run")
    report_p.add_argument("--out", help="where to write (default DIR/report)")
    report_p.set_defaults(run=_report)


def _experiment(args: argparse.Namespace) -> int:
    from shoal.studies.experiment import run_experiment, selected
    from shoal.studies.plan import plan, read_spec

    experiment = plan(read_spec(args.file), args.dir)
    console.print(
        f"experiment [bold]{escape(experiment.name)}[/]: {len(experiment.runs)} runs in "
        f"{experiment.directory}",
        highlight=False,
    )
    chosen = selected(experiment, args.runs)  # a glob that matches nothing: refused at once
    if args.plan:
        for run in experiment.runs:
            if run.name not in chosen:
                continue
            console.print(f"  {run.name}  ({run.algo}, seed {run.seed})", highlight=False)
        return 0

    def table(status: dict) -> Table:
        view = Table("run", "state", Column("env steps", justify="right"),
                     Column("wall", justify="right"))  # fmt: skip
        for run in experiment.runs:
            entry = status.get(run.name, {})
            steps = f"{entry.get('steps', 0):,} / {entry.get('total_steps', 0):,}"
            view.add_row(run.name, entry.get("state", ""), steps, f"{entry.get('wall_s', 0):.0f} s")
        return view

    with Live(table({}), console=console, refresh_per_second=2, transient=False) as live:
        status = run_experiment(
            experiment,
            args.jobs,
            on_update=lambda s: live.update(table(s)),
            ray_address=args.ray_address,
            retries=args.retries,
            only=args.runs,
        )
    failed = [name for name, entry in status.items() if entry["state"] == "failed"]
    for name in failed:
        error = status[name].get("error", "").strip().splitlines()[-3:]
        console.print(f"[red]failed[/] {name}: {' / '.join(error)}", highlight=False)
    console.print(f"\nruns: {experiment.directory}  (shoal report {experiment.directory})",
                  highlight=False)  # fmt: skip
    return 1 if failed else 0


def _tune(args: argparse.Namespace) -> int:
    from shoal.studies.plan import read_spec
    from shoal.studies.tune import tune

    tuner = tune(read_spec(args.file), args.dir, args.jobs, args.ray_address, args.storage,
                 echo=True)  # fmt: skip
    study = tuner.study()
    best = study.best_trial
    plain(
        f"{len(study.trials)} trials; best: trial {best.number}, final evaluation return "
        f"{best.value:.2f}, {best.user_attrs['values']}"
    )
    plain(f"\n# {tuner.directory / 'best.yaml'}")
    plain((tuner.directory / "best.yaml").read_text())
    return 0


def _report(args: argparse.Namespace) -> int:
    from shoal.studies.report import markdown, report

    tables = report(args.dir, args.out)
    plain(markdown(tables["scores"]))
    for row in tables["improvement"]:
        if row["x"] < row["y"]:
            plain(f"P({row['x']} > {row['y']}) = {row['p_x_better']:.2f}")
    plain(tables["method"])
    console.print(f"report: {tables['out']} (scores.md, scores.csv, improvement.csv, curves)",
                  highlight=False)  # fmt: skip
    return 0
