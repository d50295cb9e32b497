"""The training loop: drives an algorithm, evaluates, logs, checkpoints and stops.

Algorithms only return metric dicts; this loop is the one place that logs them, decides when to
evaluate and checkpoint, and handles Ctrl-C and SIGTERM (finish the iteration, save, exit) and
NaN losses (stop without saving the broken state, point at the last good checkpoint). `run`
reads top to bottom; its steps are `shoal.train.session.Session`'s.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from shoal.config import is_nested
from shoal.config.checks import check_numbers
from shoal.config.usage import check_usage
from shoal.core.device import check_precision, resolve_device
from shoal.core.errors import ConfigError, NaNLossError
from shoal.core.interfaces import AlgorithmSpec
from shoal.train.callbacks import CallbackError, build_callbacks
from shoal.train.checkpoint import Checkpoint
from shoal.train.session import RunResult, Session
from shoal.train.signals import deliver_deferred, stop_signals

__all__ = ["IterationCallback", "RunResult", "check_runtime", "run"]


IterationCallback = Callable[[int, dict[str, float]], None]


def run(
    spec: AlgorithmSpec,
    config: Any,
    resume: Checkpoint | None = None,
    on_iteration: IterationCallback | None = None,
    callbacks: Sequence[Any] = (),
) -> RunResult:
    """Train ``config`` with ``spec``'s algorithm until a stop condition; see `RunResult`.
    ``callbacks`` (`shoal.train.callbacks`) run after those the config names
    (``run.callbacks``); ``on_iteration(steps, metrics)`` is the older one-function form."""
    if spec.prepare is not None:  # settings read from outside the config
        config = spec.prepare(config)
    check_runtime(spec, config, new=resume is None)
    hooks = build_callbacks(config, callbacks, on_iteration)  # imports checked before any run
    session = Session.start(spec, config, resume, hooks)
    try:
        with stop_signals() as signalled:
            reason = session.stop_reason(signalled)  # a resumed run may be done already
            while reason is None:
                session.iterate()  # train, log, evaluate when due
                reason = session.stop_reason(signalled)
                if reason is None:
                    session.checkpoint_when_due()
            session.finish(reason)  # final evaluation, last checkpoint
    except CallbackError as exc:
        # Between iterations the algorithm's state is whole: keep it before reporting.
        saved = session.save(notify=False)
        raise CallbackError(f"{exc}; the run is saved in {saved} (continue with --resume)") from exc
    except NaNLossError as exc:
        last = session.checkpoint
        where = f"the last good checkpoint is {last}" if last else "no checkpoint yet"
        raise NaNLossError(f"{exc} at {session.unit} {session.steps:,}; {where}") from exc
    finally:
        session.close()
    result = session.result(reason)
    hooks.call("on_train_end", result)
    deliver_deferred(reason, result.checkpoint)  # a SIGTERM, put off until the run is saved
    return result


def check_runtime(spec: AlgorithmSpec, config: Any, new: bool = True) -> None:
    """Refuse, before anything is built, what this machine or this algorithm cannot do: an
    unavailable ``run.device``, a precision the device lacks, a backend the learner lacks,
    Ray runners for an algorithm that samples in its own process, a NaN setting, and (for a
    new run: a resume keeps the settings it trained with) a setting the algorithm would not
    read (`shoal.config.usage`)."""
    check_numbers(config)
    if new:
        check_usage(config, spec.default_config(), spec.name)
    if config.run.runners > 0 and not spec.runners:
        why = spec.no_runners or "samples in the learner's process (it has no Ray runners yet)"
        raise ConfigError(
            f"run.runners = {config.run.runners}: {spec.name} {why}; set run.runners 0"
        )
    if config.run.learners > 1 and not spec.learner_groups:
        why = (
            "has no gradient steps to split among learners"
            if not spec.gradients
            else spec.one_learner or "has no learner groups yet"
        )
        own = spec.scaling()["learners"]
        instead = f"; for several learners set {own}" if own else ""
        raise ConfigError(
            f"run.learners = {config.run.learners}: {spec.name} {why}{instead}; set run.learners 1"
        )
    device = resolve_device(config.run.device)
    model = getattr(config, "model", None)
    if model is None:  # a variant's model is its nested base block's (DD-PPO's, APPO's ppo)
        blocks = [getattr(config, f.name) for f in dataclasses.fields(config)]
        model = next((b.model for b in blocks if is_nested(b) and hasattr(b, "model")), None)
    if model is None:
        return
    check_precision(model.precision, device)
    if model.backend not in spec.backends:
        raise ConfigError(
            f"model.backend = {model.backend!r} is not available for {spec.name}: its learner "
            f"trains through autograd (the NumPy path serves PPO and A2C); use "
            f"{' or '.join(spec.backends)}"
        )
