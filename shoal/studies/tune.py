"""``shoal tune FILE.yaml``: hyperparameter search with Optuna (Akiba et al. 2019, "Optuna:
A Next-generation Hyperparameter Optimization Framework").

The file::

    name: ppo-cartpole-search
    base: ppo-cartpole              # a tuned example, or `algo:` and `config:` overrides
    config: {run: {total_steps: 50000}}
    search:
      optim.lr: loguniform(1e-5, 1e-2)
      num_epochs: int(1, 20)
      gae_lambda: uniform(0.9, 1.0)
      model.hidden: choice([64, 64], [256, 256])
    trials: 20
    sampler: tpe                    # or random
    pruner: median                  # or halving, or none
    seed: 0

Distributions: ``uniform(low, high)``, ``loguniform(low, high)``, ``int(low, high)``,
``logint(low, high)`` and ``choice(a, b, ...)``. A trial whose values make no valid config
(say a minibatch larger than the rollout) or whose losses turn NaN fails, and the search
goes on. Every trial trains in this process with the sampled values; its intermediate values
are its evaluations (``eval/return``), which the pruner reads to stop unpromising trials
early (median: below the median of earlier trials at the same step, from a third of a
trial's steps on and after 5 trials; halving: Li et al.'s asynchronous successive halving);
its value is the final evaluation return (maximized). The study lives in ``DIR/study.db``
(SQLite, default ``DIR = runs/tune/<name>``), so starting the same file again resumes it up
to ``trials`` finished trials; ``--jobs N`` runs N worker processes on that study, each with its
own sampler seed (a trial whose values repeat a finished trial's takes its result instead of
training again: every trial trains with the file's seed). A line per trial is printed as it
ends. The best
trial's config is written as a ready tuned-example file, ``DIR/best.yaml``.

On a Ray cluster (``--ray-address auto`` or ``HOST:PORT``) the N workers are Ray tasks on
whichever nodes have a CPU free, each running trials against the one study: Optuna with Ray
workers rather than Ray Tune's Optuna searcher, so that the search is the same code, the same
SQLite (or other) study, and resumes the same way whether it ran on a laptop or a cluster,
and Ray Tune's own trial runner, checkpointing and results layout stay out of shoal's. The
study must then be reachable from every node: ``DIR`` on shared storage, or ``storage:`` in
the file (or ``--storage``) naming an Optuna database URL such as
``postgresql://user@host/db``, which Optuna recommends over SQLite for many writers.
"""

from __future__ import annotations

import ast
import importlib.util
import multiprocessing
import os
import re
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from shoal.core.errors import ConfigError, NaNLossError, ShoalError, UnknownFieldError
from shoal.studies.plan import build, nested
from shoal.studies.plan import merge_dicts as merge
from shoal.train.signals import forward_sigterm

DISTRIBUTIONS = ("uniform", "loguniform", "int", "logint", "choice")
_CALL = re.compile(r"^\s*(\w+)\s*\((.*)\)\s*$", re.S)


def parse_distribution(field: str, text: Any) -> tuple[str, tuple]:
    """``"loguniform(1e-5, 1e-2)"`` -> ``("loguniform", (1e-5, 1e-2))``, checked."""
    match = _CALL.match(str(text))
    if str(text).count("(") != str(text).count(")"):
        raise ConfigError(
            f"search: {field}: {text!r} was cut at a comma: YAML's {{...}} mappings split at "
            "commas, so write the search one field per line or quote each distribution "
            "('loguniform(1e-5, 1e-2)')"
        )
    if not match or match.group(1) not in DISTRIBUTIONS:
        raise ConfigError(
            f"search: {field}: {text!r} is not a distribution; use one of "
            + ", ".join(f"{d}(...)" for d in DISTRIBUTIONS)
        )
    kind = match.group(1)
    try:
        args: tuple[Any, ...] = (
            ast.literal_eval(f"({match.group(2)},)") if match.group(2).strip() else ()
        )
    except (ValueError, SyntaxError) as exc:
        raise ConfigError(f"search: {field}: cannot read the arguments of {text!r}") from exc
    if kind == "choice":
        if not args:
            raise ConfigError(f"search: {field}: choice() needs at least one value")
        return kind, tuple(args)
    if len(args) != 2 or not all(isinstance(a, (int, float)) for a in args):
        raise ConfigError(f"search: {field}: {kind}(low, high) takes two numbers, not {text!r}")
    low, high = args[0], args[1]
    if not low < high or (kind in ("loguniform", "logint") and low <= 0):
        raise ConfigError(
            f"search: {field}: {text!r} needs low < high"
            + (" and low > 0" if "log" in kind else "")
        )
    if kind in ("int", "logint") and not all(float(a).is_integer() for a in args):
        raise ConfigError(f"search: {field}: {kind}() takes whole numbers, not {text!r}")
    return kind, (low, high)


def suggest(trial: Any, field: str, kind: str, args: tuple) -> Any:
    if kind == "uniform":
        return trial.suggest_float(field, *args)
    if kind == "loguniform":
        return trial.suggest_float(field, *args, log=True)
    if kind in ("int", "logint"):
        return trial.suggest_int(field, int(args[0]), int(args[1]), log=kind == "logint")
    index = trial.suggest_categorical(field, list(range(len(args))))  # values may be lists
    return args[index]


class Tuner:
    """A search file's study: the space, the sampler and pruner, and trials that train."""

    def __init__(
        self, spec: dict[str, Any], directory: str | Path | None = None, storage: str | None = None
    ):
        if importlib.util.find_spec("optuna") is None:
            raise ShoalError("shoal tune needs Optuna: pip install 'shoal[tune]'")
        known = {"name", "base", "algo", "config", "search", "trials", "sampler", "pruner",
                 "seed", "description", "storage"}  # fmt: skip
        unknown = sorted(set(spec) - known)
        if unknown:
            raise ConfigError(f"tune: unknown keys {unknown}; the keys are {sorted(known)}")
        self.spec = spec
        self.name = str(spec["name"])
        self.directory = Path(directory) if directory else Path("runs") / "tune" / self.name
        self.storage = storage or spec.get("storage") or None
        search = spec.get("search") or {}
        if not search:
            raise ConfigError("tune: the file has no search space (search: {field: dist(...)})")
        self.space = {field: parse_distribution(field, text) for field, text in search.items()}
        self.trials = int(spec.get("trials", 20))
        self.sampler = str(spec.get("sampler", "tpe"))
        self.pruner = str(spec.get("pruner", "median"))
        if self.sampler not in ("tpe", "random"):
            raise ConfigError(f"tune: sampler is tpe or random, not {self.sampler!r}")
        if self.pruner not in ("median", "halving", "none"):
            raise ConfigError(f"tune: pruner is median, halving or none, not {self.pruner!r}")
        candidates = {field: [int(v) if "int" in kind else v for v in args]
                      for field, (kind, args) in self.space.items()}  # fmt: skip
        for field, values in candidates.items():  # every field exists and takes its values
            for value in values:
                self._check(field, value, candidates)

    def _check(self, field: str, value: Any, candidates: dict[str, list[Any]]) -> None:
        """``value`` of ``field`` is valid with the base config, or with one other field at
        one of its searched values (a minibatch size may need a longer rollout); an unknown
        field fails at once."""
        try:
            self.config({field: value}, seed=0)
            return
        except UnknownFieldError:
            raise
        except ConfigError as exc:
            error = exc
        for other, values in candidates.items():
            for other_value in values if other != field else ():
                try:
                    self.config({field: value, other: other_value}, seed=0)
                    return
                except ConfigError:
                    pass
        raise error

    def config(self, values: dict[str, Any], seed: int, run_dir: Path | None = None):
        """The algorithm and config dict of a trial with ``values``."""
        spec = {**self.spec, "config": merge(self.spec.get("config") or {}, nested(values))}
        spec.pop("search", None)
        return build(spec, {}, seed, run_dir or self.directory / "trial")

    def study(self, worker: int = 0) -> Any:
        """The study, with ``worker``'s sampler: each parallel worker's sampler has its own
        seed (worker 0 the file's), or workers sharing a seed would propose the same trials."""
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        seed = int(self.spec.get("seed", 0))
        sampler_seed = seed if worker == 0 else derive_seed(seed, worker)
        sampler = (optuna.samplers.TPESampler(seed=sampler_seed) if self.sampler == "tpe"
                   else optuna.samplers.RandomSampler(seed=sampler_seed))  # fmt: skip
        # Evaluations early in a run say little of where it ends (on CartPole, the first of
        # five is noise): trials are compared from a third of their steps on, once 5 have
        # finished (Optuna's default start-up), as rl-baselines3-zoo does with its own 10.
        warmup = int(self.config({}, seed)[1]["run"]["total_steps"]) // 3
        pruner = {"median": optuna.pruners.MedianPruner(n_startup_trials=5,
                                                        n_warmup_steps=warmup),
                  "halving": optuna.pruners.SuccessiveHalvingPruner(),
                  "none": optuna.pruners.NopPruner()}[self.pruner]  # fmt: skip
        self.directory.mkdir(parents=True, exist_ok=True)
        return optuna.create_study(
            study_name=self.name,
            storage=self.storage or f"sqlite:///{self.directory / 'study.db'}",
            sampler=sampler, pruner=pruner, direction="maximize", load_if_exists=True,
        )  # fmt: skip

    def finished(self, study: Any) -> int:
        import optuna

        done = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
        return len(study.get_trials(deepcopy=False, states=done))

    def run(
        self,
        objective: Callable[[Any, Callable[[int, float], bool]], float] | None = None,
        share: int | None = None,
        worker: int = 0,
        echo: Callable[[str], None] | None = None,
    ):
        """Run trials until the study has ``trials`` finished ones (or this worker has run
        its ``share`` of them); ``objective(config, report)`` (default: train) returns a
        trial's value, calling ``report(step, value)`` with intermediate values (True:
        prune). ``worker`` seeds this worker's sampler; ``echo`` gets a line per finished,
        pruned or failed trial."""
        import optuna

        study = self.study(worker)
        objective = objective or train_objective
        fail_orphans(study)

        def trial_fn(trial: Any) -> float:
            values = {f: suggest(trial, f, kind, args) for f, (kind, args) in self.space.items()}
            trial.set_user_attr("values", values)
            trial.set_user_attr("worker", f"{socket.gethostname()}:{os.getpid()}")
            earlier = repeated_trial(study, trial.number, values)
            if earlier is not None:  # every trial trains with the same seed: same result
                trial.set_user_attr("repeat_of", earlier.number)
                if earlier.state == optuna.trial.TrialState.PRUNED:
                    trial.set_user_attr("pruned_at", earlier.user_attrs.get("pruned_at"))
                    raise optuna.TrialPruned(f"repeats pruned trial {earlier.number}")
                return float(earlier.value)
            run_dir = self.directory / f"trial-{trial.number}"
            algo, config = self.config(values, int(self.spec.get("seed", 0)), run_dir)
            pruned = []

            def report(step: int, value: float) -> bool:
                trial.report(value, step)
                if trial.should_prune():
                    pruned.append(step)
                    return True
                return False

            value = objective((algo, config), report)
            if pruned:
                trial.set_user_attr("pruned_at", pruned[0])
                raise optuna.TrialPruned(f"pruned at step {pruned[0]}")
            return value

        def announce(study: Any, trial: Any) -> None:
            if echo is not None:
                echo(trial_line(trial))

        remaining = self.trials - self.finished(study)
        if share is not None:
            remaining = min(remaining, share)
        if remaining > 0:
            # A sampled combination that is no valid config (a minibatch larger than the
            # rollout) or diverges to a NaN loss fails its trial; the search goes on. SIGTERM
            # (once the trial's run is saved) stops the search as Ctrl-C does: the trial fails.
            with forward_sigterm(lambda: ()):
                study.optimize(
                    trial_fn, n_trials=remaining, catch=(ConfigError, NaNLossError),
                    callbacks=[optuna.study.MaxTrialsCallback(
                        self.trials, states=(optuna.trial.TrialState.COMPLETE,
                                             optuna.trial.TrialState.PRUNED)), announce],
                )  # fmt: skip
        return study

    def best_yaml(self, study: Any) -> str:
        """The best trial's config as a tuned-example file."""
        best = study.best_trial
        values = best.user_attrs["values"]
        base = {k: v for k, v in self.spec.items() if k in ("base", "algo")}
        config = merge(self.spec.get("config") or {}, nested(values))
        text = {
            **base, "description": f"Found by shoal tune ({self.name}, trial {best.number} of "
            f"{len(study.trials)}).",
            "expected": f"Final evaluation return {best.value:.2f} in the search.",
            "config": config,
        }  # fmt: skip
        if "base" in text:  # a tuned example's algorithm and settings, as a standalone file
            from shoal.registry import find_tuned

            example = find_tuned(str(text.pop("base")))
            text = {"algo": example.algo, **text, "config": merge(example.config, config)}
        return yaml.safe_dump(text, sort_keys=False)


def fail_orphans(study: Any) -> list[int]:
    """Mark as failed the running trials whose worker process (on this host) is gone: a
    search killed mid-trial left them running, and they would never finish. Returns their
    numbers. Trials of workers on other hosts are left to those hosts."""
    import optuna

    host = socket.gethostname()
    orphans = []
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        worker_host, _, pid = str(trial.user_attrs.get("worker", "")).rpartition(":")
        if worker_host == host and pid.isdigit() and not _alive(int(pid)):
            study._storage.set_trial_state_values(trial._trial_id, optuna.trial.TrialState.FAIL)
            orphans.append(trial.number)
    return orphans


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def derive_seed(seed: int, worker: int) -> int:
    """A sampler seed for parallel ``worker`` of a search seeded ``seed``, distinct per
    worker and reproducible."""
    return int(np.random.SeedSequence([seed, worker]).generate_state(1)[0])


def repeated_trial(study: Any, number: int, values: dict[str, Any]) -> Any:
    """The earliest finished (complete or pruned) trial before ``number`` with ``values``,
    or None: a sampler may propose a combination again (a small categorical space, TPE
    settling on its best), and since every trial trains with the search's seed, training it
    again would only repeat the result."""
    import optuna

    done = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    for trial in study.get_trials(deepcopy=False, states=done):
        if trial.number < number and trial.user_attrs.get("values") == values:
            return trial
    return None


def trial_line(trial: Any) -> str:
    """One line for a trial that ended: number, state, value or pruning step, parameters."""
    values = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                       for k, v in trial.user_attrs.get("values", {}).items())  # fmt: skip
    repeat = trial.user_attrs.get("repeat_of")
    note = f" (repeats trial {repeat}: not trained again)" if repeat is not None else ""
    state = trial.state.name
    if state == "COMPLETE":
        head = f"value {trial.value:.2f}"
    elif state == "PRUNED":
        step = trial.user_attrs.get("pruned_at")
        head = "pruned" + (f" at step {step:,}" if step is not None else "")
    else:
        reason = trial.system_attrs.get("fail_reason", "").strip().splitlines()
        head = "failed" + (f": {reason[-1]}" if reason else "")
    return f"trial {trial.number}: {head}; {values}{note}"


def train_objective(config: tuple[str, dict[str, Any]], report: Callable[[int, float], bool]):
    """Train one trial's config; its evaluations are the intermediate values."""
    from shoal.api import train
    from shoal.config import from_dict
    from shoal.registry import get_algorithm
    from shoal.train.callbacks import Callback
    from shoal.train.signals import SIGNAL_WORDS

    algo, data = config
    spec = get_algorithm(algo)
    built = from_dict(spec.config_cls, data, base=spec.default_config())

    class Report(Callback):
        def on_evaluation(self, result: dict[str, float]) -> bool:
            return report(self.context.env_steps, result["eval/return"])

    result = train(built, callbacks=[Report()])
    if result.stop_reason in SIGNAL_WORDS:  # Ctrl-C or SIGTERM: stop the search, and the
        raise KeyboardInterrupt  # trial fails rather than count a cut-short run's value
    if result.eval_return is None:
        raise ShoalError("a trial ended without an evaluation: set run.eval_every_steps")
    return float(result.eval_return)


def _worker(
    spec: dict[str, Any], directory: str, storage: str | None, objective: Any, share: int,
    worker: int, echo: bool,
) -> None:  # fmt: skip
    Tuner(spec, directory, storage).run(objective, share, worker, _echo if echo else None)


def _echo(line: str) -> None:
    print(line, flush=True)


def tune(
    spec: dict[str, Any],
    directory: str | Path | None = None,
    jobs: int | None = 1,
    ray_address: str | None = None,
    storage: str | None = None,
    objective: Callable[[Any, Callable[[int, float], bool]], float] | None = None,
    echo: bool = False,
) -> Tuner:
    """Run the search ``spec`` (a search file's contents), ``jobs`` processes at once on its
    study; writes and returns ``best.yaml``'s tuner. With ``ray_address`` (``auto``,
    HOST:PORT, or ``local`` for a Ray started here) the ``jobs`` workers (default: the
    cluster's CPUs) are Ray tasks; ``storage`` is an Optuna storage URL (default: SQLite in
    the directory); ``objective`` replaces training (a module-level function on Ray); ``echo``
    prints a line per trial as it ends."""
    tuner = Tuner(spec, directory, storage)
    remaining = max(0, tuner.trials - tuner.finished(tuner.study()))  # created before workers

    def calls(jobs: int) -> list[tuple]:
        """Each worker's arguments, the remaining trials split between them: workers that
        each ran until the study had enough would start one trial too many between them."""
        jobs = max(1, min(jobs, remaining))
        shares = [remaining // jobs + (i < remaining % jobs) for i in range(jobs)]
        return [(spec, str(tuner.directory), storage, objective, n, worker, echo)
                for worker, n in enumerate(shares)]  # fmt: skip

    if ray_address is not None:
        from shoal.distributed import require_ray

        ray_workers = require_ray()
        ray_workers.connect(None if ray_address == "local" else ray_address)
        ray_workers.run_tasks(_worker, calls(jobs or int(ray_workers.cluster_cpus())))
    elif (jobs or 1) > 1:
        context = multiprocessing.get_context("spawn")
        workers = [context.Process(target=_worker, args=args) for args in calls(jobs or 1)]
        for w in workers:
            w.start()
        try:
            with forward_sigterm(lambda: workers):  # SIGTERM to this process reaches them
                for w in workers:
                    w.join()
        except KeyboardInterrupt:
            for w in workers:
                w.join()  # each got the signal too: it saves its trial's run and stops
            raise
    else:
        tuner.run(objective, echo=_echo if echo else None)
    study = tuner.study()
    (tuner.directory / "best.yaml").write_text(tuner.best_yaml(study))
    return tuner
