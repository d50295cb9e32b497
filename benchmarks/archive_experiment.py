"""Keep a long ``shoal experiment``'s finished runs small enough to commit, and resume from them.

A run directory of a million steps holds tens of megabytes (checkpoints, TensorBoard events, a
``metrics.jsonl`` row per iteration). What the comparisons read from a finished run is its
training curves, its training wall-clock, its evaluations and the figures a benchmark measured
on its final policy. This copies, for every run ``status.json`` records as done:

- ``config.json`` and every other ``*.json`` file the run directory holds at its top (the
  benchmarks cache what they measured on the final policy there, e.g. ``final_rates.json``);
- ``metrics.jsonl`` thinned: every evaluation row as it was, and the training rows merged
  into one row per ``--window`` env steps (at the window's last step): ``episode/*`` values
  averaged weighted by ``episode/count`` (which is summed), ``perf/iteration_s`` summed (the
  training wall-clock stays exact), every other value averaged over the rows that had it;

and the experiment's ``experiment.json``, ``status.json`` and ``configs/*.yaml``. No
checkpoint of a finished run is kept. A run the archive does not hold as done starts again
from nothing, unless ``--unfinished`` kept it: each run that is not done but has a checkpoint
(one stopped by Ctrl-C or SIGTERM at the end of a sitting) keeps its newest checkpoint and its
metrics up to that checkpoint's step, thinned, so that the experiment resumes it from there
where the archive is restored. That is the model and optimizer state: about 20 MB for the
Nature CNN, so it is meant for the one run a sitting leaves half done; when the run is
archived as done, its checkpoint is dropped from the archive.

To go on with an archived experiment on a fresh checkout, copy it back and start it again::

    cp -rn benchmarks/results/experiments/NAME/. runs/experiments/NAME/
    shoal experiment experiments/FILE.yaml --jobs 1

Usage: ``python benchmarks/archive_experiment.py SRC DEST [--window 5000] [--unfinished]``, e.g.
``python benchmarks/archive_experiment.py runs/experiments/biswas-intersection
benchmarks/results/experiments/biswas-intersection``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections import defaultdict
from pathlib import Path


def thin(rows: list[dict], window: int) -> list[dict]:
    """``rows`` (a run's metrics, in order) with the training rows merged per ``window`` env
    steps and every row holding an ``eval/`` key kept as it is."""
    out: list[dict] = []
    group: list[dict] = []

    def flush() -> None:
        if not group:
            return
        merged: dict = {"step": group[-1]["step"]}
        episodes = sum(float(r.get("episode/count", 0)) for r in group)
        sums: dict[str, float] = defaultdict(float)
        weights: dict[str, float] = defaultdict(float)
        for row in group:
            for key, value in row.items():
                if key == "step" or not isinstance(value, int | float) or isinstance(value, bool):
                    continue
                if key == "episode/count" or key == "perf/iteration_s":
                    sums[key] += value
                    weights[key] = 1.0
                    continue
                weight = float(row.get("episode/count", 1)) if key.startswith("episode/") else 1.0
                sums[key] += weight * value
                weights[key] += weight
        for key in sums:
            if key in ("episode/count", "perf/iteration_s"):
                merged[key] = sums[key]
            elif weights[key] > 0:
                merged[key] = sums[key] / weights[key]
        if episodes == 0:
            merged = {k: v for k, v in merged.items() if not k.startswith("episode/")}
        out.append(merged)
        group.clear()

    for row in rows:
        if any(key.startswith("eval/") for key in row):
            flush()
            out.append(row)
            continue
        if group and row["step"] // window != group[-1]["step"] // window:
            flush()
        group.append(row)
    flush()
    return out


def archive(source: Path, dest: Path, window: int, unfinished: bool = False) -> list[str]:
    """Copy ``source``'s finished runs (and with ``unfinished`` its stopped runs' newest
    checkpoints) into ``dest`` as described above; the runs written."""
    status = json.loads((source / "status.json").read_text())
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "configs").mkdir(exist_ok=True)
    shutil.copy2(source / "experiment.json", dest / "experiment.json")
    for config in (source / "configs").glob("*.yaml"):
        shutil.copy2(config, dest / "configs" / config.name)
    written = []
    for name, entry in status.items():
        run, kept = source / name, dest / name
        if not run.is_dir():
            continue  # (one already archived and deleted here stays as it was kept)
        if entry.get("state") == "done":
            shutil.rmtree(kept / "checkpoints", ignore_errors=True)  # kept while unfinished
            last = None
        elif unfinished and (checkpoint := _newest_checkpoint(run)) is not None:
            last = checkpoint
        else:
            continue
        kept.mkdir(exist_ok=True)
        for path in run.glob("*.json"):
            shutil.copy2(path, kept / path.name)
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        copied = False
        if last is not None:
            rows = [row for row in rows if row["step"] <= _step(last)]
            copied = _copy_checkpoint(last, kept / "checkpoints")
        text = "".join(json.dumps(row) + "\n" for row in thin(rows, window))
        if not (kept / "metrics.jsonl").exists() or (kept / "metrics.jsonl").read_text() != text:
            (kept / "metrics.jsonl").write_text(text)
            copied = True
        if copied:
            written.append(name)
    held = {n for n in status if (dest / n / "metrics.jsonl").exists()}
    kept_status = {
        n: e if n in held or e.get("state") != "done" else {**e, "state": "pending"}
        for n, e in status.items()
    }  # a run done here but not archived must run again where the archive is restored
    (dest / "status.json").write_text(json.dumps(kept_status, indent=2))
    return written


def _newest_checkpoint(run: Path) -> Path | None:
    """The checkpoint directory ``checkpoints/latest`` names in ``run``, if it is there."""
    latest = run / "checkpoints" / "latest"
    if not latest.is_file():
        return None
    checkpoint = run / "checkpoints" / latest.read_text().strip()
    return checkpoint if checkpoint.is_dir() else None


def _step(checkpoint: Path) -> int:
    return int(checkpoint.name.rsplit("_", 1)[-1])


def _copy_checkpoint(checkpoint: Path, into: Path) -> bool:
    """Make ``into`` hold ``checkpoint`` alone, and a ``latest`` that names it; whether
    anything was copied."""
    latest = into / "latest"
    kept = (into / checkpoint.name).is_dir() and latest.is_file()
    if kept and latest.read_text().strip() == checkpoint.name:
        return False  # already kept
    shutil.rmtree(into, ignore_errors=True)
    shutil.copytree(checkpoint, into / checkpoint.name)
    (into / "latest").write_text(checkpoint.name)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path)
    parser.add_argument("dest", type=Path)
    parser.add_argument("--window", type=int, default=5000, help="env steps per training row")
    parser.add_argument(
        "--unfinished",
        action="store_true",
        help="also keep each stopped run's newest checkpoint, so that it resumes from there",
    )
    args = parser.parse_args(argv)
    for name in archive(args.source, args.dest, args.window, args.unfinished):
        print(f"archived {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
