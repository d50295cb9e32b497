"""Callbacks: your code at the training loop's events (`shoal.train.loop.run`).

Subclass `Callback` and override the events you need (or write any object with some of these
methods); pass instances to ``shoal.train(..., callbacks=[...])`` or name classes in the run's
config, ``run.callbacks`` (``--run.callbacks mypkg.cbs:MyCallback``, or ``callbacks:
[mypkg.cbs:MyCallback(patience=3)]`` at the top of a YAML file; keyword arguments are Python
literals). Named callbacks are recorded in the run's config, so a resumed run has them again.

The events, in order:

* ``on_train_start(context)``: once, before the first iteration (also when resuming);
  ``context`` is a `TrainContext`: the config, the run directory, the step counters,
  `TrainContext.set_env_attr`, `TrainContext.save_checkpoint` and `TrainContext.policy`.
  `Callback` keeps it as ``self.context``.
* ``on_iteration(metrics) -> bool | None``: after each iteration's metrics are logged;
  return True to stop the run.
* ``on_evaluation(result) -> bool | None``: after each evaluation (the periodic ones and the
  final one), with its ``eval/...`` metrics; return True to stop the run.
* ``on_checkpoint(path)``: after each checkpoint is written.
* ``on_train_end(result)``: once, with the `shoal.train.loop.RunResult`.

A stopped run ends like any other: a final evaluation, a checkpoint, and the summary's
``stopped:`` line names the callback. A callback that raises does not lose the run: the loop
saves a checkpoint first, then raises `CallbackError` naming the callback and the event.
A callback with ``state_dict()`` and ``load_state_dict(state)`` has its state saved in each
checkpoint and restored on resume (the built-ins do).

Built-in (by name, no module needed): ``EarlyStopping(patience=5, min_delta=0.0)`` and
``SaveBest()``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from shoal.core.errors import ConfigError, ShoalError
from shoal.core.imports import build_named, with_methods

EVENTS = ("on_train_start", "on_iteration", "on_evaluation", "on_checkpoint", "on_train_end")


class CallbackError(ShoalError):
    """A callback raised; the run was checkpointed before this was raised."""


class TrainContext:
    """What a callback may read and do during a run."""

    def __init__(
        self,
        config: Any,
        run_dir: Path,
        algorithm: Any,
        save: Callable[[], Path],
        resumed_from: int | None,
    ):
        self.config = config
        """The run's config (a frozen dataclass)."""
        self.run_dir = run_dir
        self.resumed_from = resumed_from
        """The env step this process resumed from (None for a new run)."""
        self._algorithm = algorithm
        self._save = save

    @property
    def env_steps(self) -> int:
        return self._algorithm.env_steps

    @property
    def iteration(self) -> int:
        return self._algorithm.iteration

    def set_env_attr(self, name: str, value: Any) -> None:
        """Set attribute ``name`` to ``value`` in every training environment, Ray runners
        included (a curriculum: ``context.set_env_attr("difficulty", 2)``); the envs read
        it from their next step or reset, as their code decides. Evaluation envs keep their
        settings. Checkpoints do not record it: set it again in ``on_train_start`` on resume
        (``context.env_steps`` says where the run stands)."""
        target = getattr(self._algorithm, "sampler", None)
        if target is not None and hasattr(target, "set_env_attr"):
            target.set_env_attr(name, value)
            return
        env = getattr(self._algorithm, "env", None)
        if env is None:
            raise ShoalError(
                f"{type(self._algorithm).__name__} steps its environments in its own worker "
                "processes; set_env_attr reaches the envs of the samplers (PPO, A2C, PG, "
                "TRPO, IMPALA, the DQN and actor-critic replay families) and of the "
                "multi-agent and tabular learners"
            )
        from shoal.envs.base import set_env_attr

        set_env_attr(env, name, value)

    def save_checkpoint(self) -> Path:
        """Write a checkpoint of the run as it is now (between iterations) and return it."""
        return self._save()

    def policy(self) -> Any:
        """The policy as it is now, a copy that ``act``s on observations as ``shoal.load``'s
        does: for a callback's own evaluation."""
        return self._algorithm.policy()


class Callback:
    """Base class: every event does nothing; override those you need (module docstring)."""

    context: TrainContext

    def on_train_start(self, context: TrainContext) -> None:
        pass

    def on_iteration(self, metrics: dict[str, float]) -> bool | None:
        return None

    def on_evaluation(self, result: dict[str, float]) -> bool | None:
        return None

    def on_checkpoint(self, path: Path) -> None:
        pass

    def on_train_end(self, result: Any) -> None:
        pass


class EarlyStopping(Callback):
    """Stop when ``metric`` (the evaluation return by default) has not improved on its best
    by more than ``min_delta`` for ``patience`` evaluations in a row."""

    def __init__(self, patience: int = 5, min_delta: float = 0.0, metric: str = "eval/return"):
        if patience < 1:
            raise ConfigError(f"EarlyStopping patience = {patience} is invalid: must be >= 1")
        self.patience, self.min_delta, self.metric = patience, min_delta, metric
        self.best: float | None = None
        self.since_best = 0
        self.stop_reason = ""

    def on_evaluation(self, result: dict[str, float]) -> bool:
        value = result.get(self.metric)
        if value is None:
            return False
        if self.best is None or value > self.best + self.min_delta:
            self.best, self.since_best = float(value), 0
            return False
        self.since_best += 1
        if self.since_best < self.patience:
            return False
        self.stop_reason = (
            f"no improvement of {self.metric} in {self.patience} evaluations (best {self.best:g})"
        )
        return True

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "since_best": self.since_best}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.since_best = state["best"], state["since_best"]


class SaveBest(Callback):
    """Keep the checkpoint of the best evaluation so far (by ``metric``) in ``RUN/best``
    (``shoal eval RUN/best``, ``shoal.load("RUN/best")``), with ``best.json`` saying the
    step and the value."""

    def __init__(self, metric: str = "eval/return"):
        self.metric = metric
        self.best: float | None = None

    def on_evaluation(self, result: dict[str, float]) -> None:
        value = result.get(self.metric)
        if value is None or (self.best is not None and value <= self.best):
            return
        self.best = float(value)
        checkpoint = self.context.save_checkpoint()
        best = self.context.run_dir / "best"
        staging = self.context.run_dir / ".best-tmp"
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(checkpoint, staging)
        info = {"env_steps": self.context.env_steps, self.metric: self.best}
        (staging / "best.json").write_text(json.dumps(info, indent=2))
        shutil.rmtree(best, ignore_errors=True)
        os.replace(staging, best)

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best = state["best"]


BUILT_IN: dict[str, type] = {"EarlyStopping": EarlyStopping, "SaveBest": SaveBest}


def make_callback(spec: str) -> Any:
    """The callback a ``run.callbacks`` entry names: ``Name`` or ``module:Class``, with
    optional ``(key=literal, ...)`` arguments."""
    needs = with_methods(EVENTS, f"a callback class (one with {', '.join(EVENTS)})")
    callback = build_named(spec, "run.callbacks entry", "callback", BUILT_IN, check=needs)
    return checked(callback, f"run.callbacks entry {spec!r} is invalid: it")


def checked(callback: Any, what: str) -> Any:
    """``callback``, unless it has none of the events (``what`` names it in the error)."""
    if not any(callable(getattr(callback, event, None)) for event in EVENTS):
        raise ConfigError(f"{what} has none of the events {', '.join(EVENTS)}")
    return callback


class FunctionCallback(Callback):
    """``on_iteration(steps, metrics)`` as a function, the older form of ``shoal.train``."""

    def __init__(self, fn: Callable[[int, dict[str, float]], Any]):
        self.fn = fn

    def on_iteration(self, metrics: dict[str, float]) -> bool | None:
        return bool(self.fn(self.context.env_steps, metrics))


class Callbacks:
    """The run's callbacks, called in order at each event by the loop."""

    def __init__(self, callbacks: Sequence[Any]):
        self.callbacks = list(callbacks)
        self.stop_reason: str | None = None
        """Why a callback asked to stop (None: none did)."""

    def __bool__(self) -> bool:
        return bool(self.callbacks)

    def start(self, context: TrainContext) -> None:
        for callback in self.callbacks:
            with contextlib.suppress(AttributeError):  # slotted or frozen: it gets the argument
                callback.context = context
        self.call("on_train_start", context)

    def call(self, event: str, argument: Any) -> bool:
        """Call ``event`` on each callback; True when one asked to stop. An exception is
        raised as `CallbackError` (the loop checkpoints before it propagates)."""
        stop = False
        for callback in self.callbacks:
            method = getattr(callback, event, None)
            if method is None:
                continue
            try:
                wants_stop = method(argument)
            except Exception as exc:
                raise CallbackError(
                    f"callback {type(callback).__name__}.{event} raised {type(exc).__name__}: {exc}"
                ) from exc
            if wants_stop and event in ("on_iteration", "on_evaluation") and not stop:
                stop = True
                detail = getattr(callback, "stop_reason", "") or f"{event} returned True"
                self.stop_reason = f"callback {type(callback).__name__}: {detail}"
        return stop

    def state_dict(self) -> list[Any]:
        return [
            callback.state_dict() if hasattr(callback, "state_dict") else None
            for callback in self.callbacks
        ]

    def load_state_dict(self, states: list[Any] | None) -> None:
        """Restore the states saved by position (a run resumed with other callbacks restores
        those whose position and class still match, by their ``load_state_dict``)."""
        for callback, state in zip(self.callbacks, states or [], strict=False):
            if state is not None and hasattr(callback, "load_state_dict"):
                callback.load_state_dict(state)


def build_callbacks(config: Any, given: Sequence[Any] = (), on_iteration: Any = None) -> Callbacks:
    """The config's named callbacks, then ``given`` objects, then an ``on_iteration``
    function; all checked before training."""
    callbacks = [make_callback(spec) for spec in config.run.callbacks]
    callbacks += [checked(callback, f"callback {callback!r}") for callback in given]
    if on_iteration is not None:
        callbacks.append(FunctionCallback(on_iteration))
    return Callbacks(callbacks)
