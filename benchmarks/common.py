"""What the benchmarks against Stable-Baselines3 share: the solve criterion, the timed runs of
both libraries, warm-up, medians and report helpers.

The benchmarks are scripts (``python benchmarks/x.py``); Python puts the script's directory on
``sys.path``, so they import this module as ``common``.

Every benchmark solves the same way, with its own `SolveCriterion` (`CARTPOLE` by default):
every ``eval_every`` env steps, shoal's own evaluator runs the deterministic policy for one
episode on each of ``eval_episodes`` separate environments, and a run is solved when the mean
return is >= ``target_return``. The clock is paused while evaluating; building the envs and the
model is timed; imports are not (untimed warm-up).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

import shoal
from shoal.collect.evaluate import evaluate
from shoal.core.seeding import derive_seed
from shoal.core.threads import set_compute_threads

try:
    import stable_baselines3
    from stable_baselines3.common.callbacks import BaseCallback
except ImportError:  # pragma: no cover - reported by the benchmarks' main()
    stable_baselines3 = None
    BaseCallback = object

TORCH_THREADS = 1


@dataclass(frozen=True)
class SolveCriterion:
    """When a run counts as solved: the mean return of ``eval_episodes`` deterministic
    episodes (one per separate environment) is >= ``target_return``, evaluated every
    ``eval_every`` env steps."""

    target_return: float
    eval_every: int
    eval_episodes: int

    def describe(self) -> str:
        """For report titles."""
        return (
            f"solved = mean of {self.eval_episodes} deterministic episodes >= "
            f"{self.target_return:g}, checked every {self.eval_every} env steps"
        )

    def settings(self) -> dict[str, Any]:
        """For JSON reports, under shoal's config names."""
        return {
            "target_return": self.target_return,
            "eval_every_steps": self.eval_every,
            "eval_episodes": self.eval_episodes,
        }


CARTPOLE = SolveCriterion(target_return=475.0, eval_every=8192, eval_episodes=20)
"""CartPole-v1 (the PPO, DQN and A2C benchmarks)."""

SHOAL_QUIET = {
    "run.console": False,
    "run.tensorboard": False,
    "run.checkpoint_every_steps": 0,
    "run.torch_threads": TORCH_THREADS,
}


@dataclass
class RunRecord:
    config: str
    seed: int
    kind: str
    """solve: train until solved or the budget ends; throughput: a fixed budget, no evaluation."""
    solved: bool
    env_steps: int
    """Env steps when solved (or at the end of the budget)."""
    setup_s: float
    train_s: float
    untimed_s: float
    """Excluded from the clock: evaluation (for shoal also logging and the final checkpoint)."""
    eval_return: float | None
    evaluations: int

    @property
    def solve_s(self) -> float:
        """Wall-clock to solve: set-up (envs and model) plus training, evaluation excluded."""
        return self.setup_s + self.train_s

    @property
    def steps_per_s(self) -> float:
        return self.env_steps / self.train_s


def record_dict(record: RunRecord) -> dict[str, Any]:
    """A run for the JSON report: its fields plus the derived figures."""
    return asdict(record) | {"solve_s": record.solve_s, "steps_per_s": record.steps_per_s}


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def require_sb3() -> bool:
    """False (with a message) when stable-baselines3 is not installed."""
    if stable_baselines3 is None:
        print("stable-baselines3 is missing: pip install -e '.[bench]'", file=sys.stderr)
        return False
    return True


def base_parser(doc: str) -> argparse.ArgumentParser:
    """The options every benchmark has: ``--seeds``, ``--json``, ``--quick``, ``--backend``."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3, help="seeds per configuration")
    parser.add_argument("--json", type=Path, help="also write every run and the summary here")
    parser.add_argument("--quick", action="store_true", help="smoke check: 1 seed, short budget")
    parser.add_argument(
        "--backend",
        choices=["auto", "torch", "numpy"],
        default="auto",
        help="shoal's model.backend for every shoal run (auto: numpy where it applies)",
    )
    return parser


def use_backend(backend: str) -> None:
    """Every shoal run of this process trains with ``model.backend`` ``backend``."""
    SHOAL_QUIET["model.backend"] = backend


# --- shoal -------------------------------------------------------------------------------------


def shoal_run(
    workdir: Path,
    name: str,
    seed: int,
    total_steps: int,
    solve: bool,
    *,
    tuned: str | None = None,
    algo: str | None = None,
    env: str | None = None,
    overrides: dict[str, Any] | None = None,
    on_iteration: Callable[[int, dict[str, float]], None] | None = None,
    criterion: SolveCriterion = CARTPOLE,
) -> RunRecord:
    """One shoal run of a tuned example (``tuned``) or of ``algo`` on ``env``, with
    ``overrides`` on top; the loop's own clocks exclude evaluation and checkpointing.

    ``solve``: evaluate as ``criterion`` says and stop when solved; otherwise a fixed budget
    of ``total_steps`` without evaluation."""
    kwargs: dict[str, Any] = dict(SHOAL_QUIET)
    kwargs["run.total_steps"] = total_steps
    if solve:
        kwargs |= {f"run.{key}": value for key, value in criterion.settings().items()}
    else:
        kwargs["run.eval_every_steps"] = 0
        kwargs["run.target_return"] = None
    kwargs.update(overrides or {})
    run_dir = str(workdir / f"{name}-{seed}-{'solve' if solve else 'throughput'}")
    if tuned is not None:
        result = shoal.train(
            tuned=tuned, seed=seed, run_dir=run_dir, on_iteration=on_iteration, **kwargs
        )
    else:
        result = shoal.train(
            algo, env=env, seed=seed, run_dir=run_dir, on_iteration=on_iteration, **kwargs
        )
    evaluations = result.env_steps // criterion.eval_every if solve else 0
    return RunRecord(
        config=name,
        seed=seed,
        kind="solve" if solve else "throughput",
        solved=result.solved,
        env_steps=result.env_steps,
        setup_s=result.setup_s,
        train_s=result.train_s,
        untimed_s=result.wall_s - result.setup_s - result.train_s,
        eval_return=result.eval_return,
        evaluations=evaluations,
    )


# --- Stable-Baselines3 -------------------------------------------------------------------------


class SB3Policy:
    """Lets shoal's evaluator drive an SB3 model: batched numpy observations to actions."""

    def __init__(self, model: Any):
        self.model = model

    def act(self, obs: np.ndarray, deterministic: bool = True) -> np.ndarray:
        return self.model.predict(obs, deterministic=deterministic)[0]


class RecurrentSB3Policy:
    """`SB3Policy` for sb3-contrib's recurrent models: carries the LSTM state from call to
    call, from a zero state at the first (a fresh one per evaluation: shoal's evaluator scores
    the first episode of each env)."""

    def __init__(self, model: Any):
        self.model = model
        self.state = None
        self.starts: np.ndarray | None = None

    def act(self, obs: np.ndarray, deterministic: bool = True) -> np.ndarray:
        if self.starts is None:
            self.starts = np.ones(len(obs), dtype=bool)
        actions, self.state = self.model.predict(
            obs, state=self.state, episode_start=self.starts, deterministic=deterministic
        )
        self.starts = np.zeros(len(obs), dtype=bool)
        return actions


class EvalAndStop(BaseCallback):
    """Evaluates after each training phase that crosses a multiple of ``criterion.eval_every``
    env steps, with the clock paused, and stops learning once solved (or after ``stop_after``
    steps). ``eval_env`` holds ``criterion.eval_episodes`` envs (None: never evaluate);
    ``policy_fn(model)`` is what the evaluator acts with (`SB3Policy`, or `RecurrentSB3Policy`
    for recurrent models).

    Works for on- and off-policy SB3 algorithms alike: both call ``on_rollout_start`` before
    collecting a rollout, which is after the training on the previous rollout (PPO's
    ``learn`` trains after ``collect_rollouts`` returns; off-policy ``learn`` trains after
    ``collect_rollouts`` returns and then calls it again). That is the point where shoal's loop
    evaluates too, after an iteration's update. The one vector step SB3 then takes before
    ``on_step`` can stop it is not counted in the time or the steps to solve.
    """

    def __init__(
        self,
        seed: int,
        eval_env: Any = None,
        stop_after: int | None = None,
        criterion: SolveCriterion = CARTPOLE,
        policy_fn: Callable[[Any], Any] = SB3Policy,
    ):
        super().__init__()
        self.policy_fn = policy_fn
        self.seed = seed
        self.eval_env = eval_env
        self.stop_after = stop_after
        self.criterion = criterion
        self.next_eval = criterion.eval_every
        self.evaluations = 0
        self.eval_s = 0.0
        self.eval_return: float | None = None
        self.solved_at: tuple[int, float] | None = None  # (env steps, perf_counter)

    def _on_rollout_start(self) -> None:
        if self.eval_env is None or self.solved_at or self.num_timesteps < self.next_eval:
            return
        start = time.perf_counter()
        seed = derive_seed(self.seed, "eval", self.evaluations)
        policy = self.policy_fn(self.model)
        self.eval_return = evaluate(policy, self.eval_env, seed)["eval/return"]
        self.evaluations += 1
        every = self.criterion.eval_every
        self.next_eval = (self.num_timesteps // every + 1) * every
        if self.eval_return >= self.criterion.target_return:
            self.solved_at = (self.num_timesteps, start)
        else:
            self.eval_s += time.perf_counter() - start

    def _on_training_end(self) -> None:
        # learn() ends after the last training phase without starting another rollout. When
        # that phase ended on a multiple of eval_every, evaluate, as shoal's loop does after
        # its last iteration (nothing is due when the budget is not such a multiple).
        self._on_rollout_start()

    def _on_step(self) -> bool:
        if self.solved_at is not None:
            return False
        return self.stop_after is None or self.num_timesteps <= self.stop_after


def sb3_run(
    config: str,
    env_id: str,
    make_model: Callable[[int], Any],
    seed: int,
    learn_steps: int,
    solve: bool,
    stop_after: int | None = None,
    criterion: SolveCriterion = CARTPOLE,
    policy_fn: Callable[[Any], Any] = SB3Policy,
) -> tuple[RunRecord, Any]:
    """One SB3 run: ``make_model(seed)`` builds the envs and the model, then
    ``learn(learn_steps)`` with `EvalAndStop`. The clock runs from building the envs and model
    to the stop, minus evaluation.

    ``solve``: evaluate as ``criterion`` says and stop when solved (unsolved: the whole
    budget counts).
    Otherwise a fixed budget: no evaluation, stop after ``stop_after`` env steps (the vector step
    taken to stop is not counted). Returns the record and the model (its env closed)."""
    set_compute_threads(TORCH_THREADS)  # torch and NumPy BLAS, as shoal runs set them
    eval_env = shoal.make_env(env_id, num_envs=criterion.eval_episodes) if solve else None
    try:
        start = time.perf_counter()
        model = make_model(seed)
        setup_s = time.perf_counter() - start
        if solve:
            callback = EvalAndStop(seed, eval_env, criterion=criterion, policy_fn=policy_fn)
        else:
            callback = EvalAndStop(seed, stop_after=stop_after, criterion=criterion)
        model.learn(learn_steps, callback=callback)
        end = time.perf_counter()
        model.get_env().close()
    finally:
        if eval_env is not None:
            eval_env.close()
    if callback.solved_at is not None:
        env_steps, end = callback.solved_at
    else:
        env_steps = model.num_timesteps if solve or stop_after is None else stop_after
    train_s = end - start - setup_s - callback.eval_s
    record = RunRecord(
        config=config,
        seed=seed,
        kind="solve" if solve else "throughput",
        solved=callback.solved_at is not None,
        env_steps=env_steps,
        setup_s=setup_s,
        train_s=train_s,
        untimed_s=callback.eval_s,
        eval_return=callback.eval_return,
        evaluations=callback.evaluations,
    )
    return record, model


def sb3_warm_up(
    env_id: str,
    make_model: Callable[[int], Any],
    learn_steps: int,
    criterion: SolveCriterion = CARTPOLE,
) -> None:
    """Untimed: build an SB3 model, train it briefly and evaluate it once on
    ``criterion.eval_episodes`` envs (lazy imports, allocator, evaluator)."""
    set_compute_threads(TORCH_THREADS)  # torch and NumPy BLAS, as shoal runs set them
    model = make_model(0)
    model.learn(learn_steps)
    eval_env = shoal.make_env(env_id, num_envs=criterion.eval_episodes)
    evaluate(SB3Policy(model), eval_env, 0)
    eval_env.close()
    model.get_env().close()


# --- reports -----------------------------------------------------------------------------------


def run_line(record: RunRecord) -> str:
    """One line per finished run, for the progress log."""
    status = "solved" if record.solved else "not solved"
    if record.kind == "throughput":
        status = "fixed budget"
    return (
        f"  {record.config:<12} seed {record.seed} {record.kind:<10} {status:<12} "
        f"{record.env_steps:>7} steps  {record.solve_s:7.2f} s  "
        f"{record.steps_per_s:>9,.0f} steps/s  (untimed {record.untimed_s:.2f} s)"
    )


def print_checks(console: Any, checks: dict[str, dict[str, Any]]) -> None:
    """The targets table: each check's description, value, target and PASS/FAIL."""
    from rich.table import Table

    table = Table(title="targets")
    table.add_column("check")
    table.add_column("value", justify="right")
    table.add_column("target", justify="right")
    table.add_column("result")
    for check in checks.values():
        value, target = check["value"], check["target"]
        fmt = (lambda v: f"{v:,.0f}") if target >= 1000 else (lambda v: f"{v:.2f}x")
        table.add_row(
            check["description"],
            fmt(value),
            ">= " + fmt(target),
            "[green]PASS[/green]" if check["pass"] else "[red]FAIL[/red]",
        )
    console.print(table)


def environment() -> dict[str, Any]:
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": TORCH_THREADS,
        "shoal": getattr(shoal, "__version__", "unknown"),
        "stable_baselines3": stable_baselines3.__version__,
        "numpy": np.__version__,
    }
