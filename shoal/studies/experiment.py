"""Experiments run: each planned run (`shoal.studies.plan`) a ``shoal train`` process of
its own, ``--jobs`` at a time (``shoal experiment FILE.yaml``, ``shoal.experiment(...)``).

Runs land in the experiment directory (default ``runs/experiments/<name>``), one run
directory each in the usual layout, with ``experiment.json`` (the plan) and ``status.json``
(each run's state, wall-clock and error). Starting the same file on the same directory
resumes: finished runs are kept, interrupted ones resume from their last checkpoint (or
start again when they had none); a directory that holds another experiment is refused. A
file whose only change is a raised budget (``run.total_steps``) extends the experiment: its
finished runs go on from their last checkpoint to the new budget, provided their schedules
do not anneal over the budget (``optim.anneal_steps`` set). A run that fails is recorded
with the end of its error output and the others go on.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from shoal.config import from_dict
from shoal.core.errors import ShoalError
from shoal.registry import get_algorithm
from shoal.studies.fork_server import start_command
from shoal.studies.plan import Experiment, PlannedRun, plain, plan, read_spec
from shoal.train.signals import forward_sigterm

# A run's exit status when Ctrl-C or SIGTERM stopped it, after it saved: 130, or the SIGTERM
# it put off and then let end it (-15 as subprocess reports it; 143 where a handler exited).
STOPPED = (130, 143, -signal.SIGTERM)


def _status(experiment: Experiment) -> dict[str, dict[str, Any]]:
    path = experiment.directory / "status.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _save_status(experiment: Experiment, status: dict[str, dict[str, Any]]) -> None:
    path = experiment.directory / "status.json"
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(status, indent=2))
    os.replace(temporary, path)


def _plan_difference(experiment: Experiment, held: dict[str, Any]) -> str | None:
    """Why the plan a directory holds (``experiment.json`` and its ``configs/``) is not
    ``experiment``'s though its fingerprint differs, or None when it is: every run that has
    started is still planned, its config equal once read by this shoal except that its budget
    (``run.total_steps``) may have been raised. Runs that have not started may be added,
    dropped or changed. So a shoal that added a config field (its default keeping the old
    behaviour) resumes the experiments an older one started, a longer budget extends them,
    more seeds or variants add runs beside the finished ones, and a run still waiting
    (``--runs`` left it for later, or its directory was removed) takes the file's settings as
    they are now; any other change to a run with results, or a lowered budget, is refused."""
    another = (
        f"{experiment.directory} holds the runs of another experiment ({held.get('name')!r}, "
        f"{len(held.get('runs', []))} runs); give this one another directory (--dir)"
    )
    planned = {run.name for run in experiment.runs}
    held_names = [str(r.get("name")) for r in held.get("runs", [])]
    if any(n not in planned and (experiment.directory / n).exists() for n in held_names):
        return another
    for run in experiment.runs:
        if not (experiment.directory / run.name).exists():
            continue  # never started: nothing of it to keep, so it runs as planned now
        path = experiment.directory / "configs" / f"{run.name}.yaml"
        try:
            saved = yaml.safe_load(path.read_text())
            if saved["algo"] != run.algo:
                return another
            spec_cls = get_algorithm(run.algo).config_cls
            config: Any = from_dict(spec_cls, saved["config"], path=str(path))
        except (OSError, KeyError, TypeError, yaml.YAMLError, ShoalError):
            return another
        held_config = plain(config)
        if _without_budget(held_config) != _without_budget(run.config):
            return another
        had, planned = held_config["run"]["total_steps"], run.config["run"]["total_steps"]
        if planned < had:
            return (
                f"{experiment.directory}: run {run.name}'s budget is {had:,} steps and this file "
                f"gives {planned:,}; a budget can be raised (finished runs go on from their "
                "last checkpoint), not lowered: give this one another directory (--dir)"
            )
        stretched = _horizons_from_budget(run.config)
        if planned > had and stretched:
            return (
                f"{experiment.directory}: run {run.name} anneals over its budget "
                f"({', '.join(stretched)} unset), so raising the budget from {had:,} to "
                f"{planned:,} steps would change its schedules mid-run. Only runs whose "
                "schedules have horizons of their own can be extended: give this one another "
                "directory (--dir), with those fields set in the file"
            )
    return None


def _without_budget(config: dict[str, Any]) -> dict[str, Any]:
    return {**config, "run": {**config["run"], "total_steps": None}}


def _horizons_from_budget(config: dict[str, Any]) -> list[str]:
    """The fields of a run's config whose schedules take ``run.total_steps`` as their
    horizon because they are unset (learning rate, clip range and replay priorities anneal
    over ``optim.anneal_steps``; CTEDD's entropy factor over ``alpha_anneal_steps``)."""
    fields = [("optim.anneal_steps", config.get("optim", {}), "anneal_steps"),
              ("alpha_anneal_steps", config, "alpha_anneal_steps")]  # fmt: skip
    return [name for name, block, key in fields if key in block and block[key] is None]


def prepare(experiment: Experiment) -> dict[str, dict[str, Any]]:
    """Create the directory and its plan, or check that it holds this experiment; the runs'
    status (running ones from an interrupted start become pending with the wall-clock they
    last recorded, and forget it and their attempts when their directory is gone: they start
    from nothing)."""
    directory = experiment.directory
    plan_file = directory / "experiment.json"
    if plan_file.exists():
        held = json.loads(plan_file.read_text())
        if held.get("fingerprint") != experiment.fingerprint:
            difference = _plan_difference(experiment, held)
            if difference is not None:
                raise ShoalError(difference)
    elif directory.exists() and any(directory.iterdir()):
        raise ShoalError(f"{directory} is not empty and holds no experiment; use another --dir")
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "configs").mkdir(exist_ok=True)
    plan_file.write_text(json.dumps({
        "name": experiment.name, "fingerprint": experiment.fingerprint,
        "spec": experiment.source,
        "runs": [{"name": r.name, "variant": r.variant, "values": r.values, "seed": r.seed,
                  "algo": r.algo} for r in experiment.runs],
    }, indent=2, default=str))  # fmt: skip
    held_status = _status(experiment)
    status = {run.name: held_status.get(run.name, {"state": "pending"}) for run in experiment.runs}
    for stale in (directory / "configs").glob("*.yaml"):
        if stale.stem not in status:  # a run dropped from the file before it started
            stale.unlink()
    for run in experiment.runs:
        entry = status[run.name]
        if entry["state"] in ("running", "interrupted"):
            # a start killed before it could record its end (the machine went down) keeps
            # the wall-clock it last recorded, as a stopped one does
            entry.update(state="pending", wall_before_s=entry.get("wall_s", 0.0))
            if not (directory / run.name).exists():  # nothing of it is left (an archive
                entry = status[run.name] = {"state": "pending"}  # restored): no wall-clock
        budget = run.config["run"]["total_steps"]
        if entry["state"] == "done" and entry.get("total_steps", budget) < budget:
            entry["state"] = "pending"  # its budget was raised: on from its last checkpoint
        (directory / "configs" / f"{run.name}.yaml").write_text(
            yaml.safe_dump(
                {
                    "algo": run.algo,
                    "description": f"{experiment.name}: {run.name}",
                    "config": run.config,
                },
                sort_keys=False,
            )  # fmt: skip
        )
    _save_status(experiment, status)
    return status


def command(experiment: Experiment, run: PlannedRun, threads: int) -> list[str]:
    """The ``shoal train`` command of one run (its arguments after ``shoal``): resume from
    its checkpoint when it has one (to the plan's budget, which may have been raised since
    the run started). Either way the run gets this start's share of the cores, not the one
    it was started with under another ``--jobs``."""
    run_dir = experiment.directory / run.name
    train = ["train"]
    share = ["--run.torch-threads", str(threads)]
    if (run_dir / "checkpoints" / "latest").exists():
        budget = str(run.config["run"]["total_steps"])
        return [*train, "--resume", str(run_dir), "--run.total-steps", budget, *share]
    if run_dir.exists():  # started, but stopped before its first checkpoint: start again
        shutil.rmtree(run_dir)
    config = experiment.directory / "configs" / f"{run.name}.yaml"
    return [*train, "--config", str(config), *share]


def progress(run_dir: Path) -> int:
    """Env steps the run has logged (its last metrics row)."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return 0
    try:
        with path.open("rb") as handle:
            handle.seek(max(0, path.stat().st_size - 4096))
            last = handle.read().splitlines()[-1]
        return int(json.loads(last).get("step", 0))
    except (IndexError, ValueError, OSError):
        return 0


def selected(experiment: Experiment, patterns: Sequence[str] | None) -> set[str]:
    """The names of the runs that ``patterns`` (shell globs, ``ppo-breakout-*``) match, every
    run's when there are none; a pattern that matches no run is an error naming the runs."""
    names = [run.name for run in experiment.runs]
    if not patterns:
        return set(names)
    unmatched = [p for p in patterns if not fnmatch.filter(names, p)]
    if unmatched:
        raise ShoalError(
            f"no run of {experiment.name} matches {', '.join(map(repr, unmatched))}; its runs "
            f"are {', '.join(names)}"
        )
    return {name for name in names if any(fnmatch.fnmatchcase(name, p) for p in patterns)}


def run_experiment(
    experiment: Experiment,
    jobs: int | None = None,
    on_update: Callable[[dict[str, dict[str, Any]]], None] | None = None,
    poll: float = 0.5,
    ray_address: str | None = None,
    retries: int = 2,
    only: Sequence[str] | None = None,
) -> dict[str, dict[str, Any]]:
    """Run every unfinished run of ``experiment`` (of those ``only``'s globs match, where
    given: the rest wait for a later start), ``jobs`` at a time (default: the cores),
    each in its own process; returns the runs' status. With ``ray_address`` (``auto``, or
    HOST:PORT; ``local`` starts a Ray here) each run is a Ray task on whichever node has a
    CPU free, ``jobs`` (default: the cluster's CPUs) at a time: the experiment directory
    must then be on storage every node shares, and every node needs shoal installed at the
    same Python path. A run that crashes (killed, out of memory, an exception) is started
    again, from its last checkpoint, up to ``retries`` times before it is recorded as failed
    with its error; a run refused for bad input (exit status 2) is not retried."""
    chosen = selected(experiment, only)
    status = prepare(experiment)
    jobs, threads, launch = _launcher(jobs, ray_address)
    pending = [r for r in experiment.runs if status[r.name]["state"] != "done" and r.name in chosen]
    for run in pending:
        status[run.name]["attempts"] = 0
    if on_update is not None:  # finished runs show at once (all of them, run again when done)
        on_update(status)
    active: dict[str, tuple[Any, float]] = {}
    ended: dict[str, float] = {}
    changed = threading.Event()  # a run ended: schedule the next one at once

    def wait(name: str, process: Any) -> None:
        process.wait()
        ended[name] = time.time()
        changed.set()

    totals = {r.name: int(r.config["run"]["total_steps"]) for r in experiment.runs}

    def local_runs() -> list[Any]:  # SIGTERM to the experiment alone reaches these too
        return [p for p, _ in active.values() if not hasattr(p, "cancel")]

    with forward_sigterm(local_runs):
        try:
            while pending or active:
                while pending and len(active) < jobs:
                    run = pending.pop(0)
                    log = experiment.directory / "configs" / f"{run.name}.log"
                    process = launch(command(experiment, run, threads), log)
                    active[run.name] = (process, time.time())
                    threading.Thread(target=wait, args=(run.name, process), daemon=True).start()
                    status[run.name].update(state="running", error=None)
                finished = False
                for name, (process, started) in list(active.items()):
                    entry = status[name]
                    entry["steps"] = progress(experiment.directory / name)
                    entry["total_steps"] = totals[name]
                    code = process.poll() if name in ended else None
                    now = ended.get(name, time.time())
                    entry["wall_s"] = entry.get("wall_before_s", 0.0) + now - started
                    if code is None:
                        continue
                    del active[name]
                    finished = True
                    if _settle(experiment, name, entry, code, retries):
                        pending.append(next(r for r in experiment.runs if r.name == name))
                _save_status(experiment, status)
                if on_update is not None:
                    on_update(status)
                if active and not finished:  # (a run that ended frees a job: fill it at once)
                    changed.wait(poll)
                    changed.clear()
        except KeyboardInterrupt:
            _interrupted(experiment, status, active)
            raise
    return status


def _interrupted(
    experiment: Experiment,
    status: dict[str, dict[str, Any]],
    active: dict[str, tuple[Any, float]],
) -> None:
    """Ctrl-C: the running runs end, each saved where it is, and are recorded interrupted
    with the wall-clock they ran, which a later start adds to."""
    for name, (process, started) in active.items():
        if hasattr(process, "cancel"):  # a Ray task: stopped where it is
            process.cancel()
        else:
            process.wait()  # the run got the signal too: it saves a checkpoint and exits
        entry = status[name]
        entry["wall_s"] = entry.get("wall_before_s", 0.0) + time.time() - started
        entry.update(state="interrupted", wall_before_s=entry["wall_s"])
    _save_status(experiment, status)


def _launcher(
    jobs: int | None, ray_address: str | None
) -> tuple[int, int, Callable[[list[str], Path], Any]]:
    """How many runs go at once, the torch threads of each, and what starts a run's command
    (``shoal ARGS``) with its output to a log: a process here, forked from a process that
    imported torch once (`shoal.studies.fork_server`), or a Ray task where ``ray_address`` is
    given."""
    if ray_address is not None:
        from shoal.distributed import require_ray

        workers = require_ray()
        workers.connect(None if ray_address == "local" else ray_address)

        def remote(command: list[str], log: Path) -> Any:
            shoal = [sys.executable, "-m", "shoal.cli"]  # (the same path on every node)
            return workers.RemoteCommand([*shoal, *command], str(log), cpus=1)

        return max(1, jobs or int(workers.cluster_cpus())), 1, remote
    jobs = max(1, jobs or os.cpu_count() or 1)

    return jobs, max(1, (os.cpu_count() or 1) // jobs), start_command


def _settle(
    experiment: Experiment, name: str, entry: dict[str, Any], code: int, retries: int
) -> bool:
    """Record in ``entry`` how run ``name`` ended (exit status ``code``); True when it is to
    be started again: it crashed and has retries left."""
    entry["wall_before_s"] = entry["wall_s"]
    entry["attempts"] = entry.get("attempts", 0) + 1
    if code == 0:
        entry["state"] = "done"
        return False
    if code not in (2, *STOPPED) and entry["attempts"] <= retries:
        entry["state"] = "pending"  # a crash: again, from its last checkpoint
        return True
    entry["state"] = "interrupted" if code in STOPPED else "failed"
    log = experiment.directory / "configs" / f"{name}.log"
    entry["error"] = log.read_text(errors="replace")[-2000:]
    entry["exit_code"] = code
    return False


def experiment(
    file_or_spec: str | Path | dict[str, Any],
    directory: str | Path | None = None,
    jobs: int | None = None,
    on_update: Callable[[dict[str, dict[str, Any]]], None] | None = None,
    ray_address: str | None = None,
    only: Sequence[str] | None = None,
) -> dict[str, dict[str, Any]]:
    """Plan and run an experiment (a file's path or its contents as a dict), or those of its
    runs whose names ``only``'s globs match; returns each run's status (``state`` done,
    failed, interrupted or, for runs not run yet, pending; ``wall_s``, ``error``)."""
    spec = read_spec(file_or_spec) if not isinstance(file_or_spec, dict) else dict(file_or_spec)
    spec.setdefault("name", "experiment")
    return run_experiment(
        plan(spec, directory), jobs, on_update, ray_address=ray_address, only=only
    )
