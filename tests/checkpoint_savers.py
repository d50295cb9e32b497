"""The processes that `train/test_checkpoint_faults.py` kills while they save checkpoints.

They start from a fork server that imported shoal's checkpoint module (and with it torch)
once, so each one costs a fork instead of a Python start and an import of torch:
`processes()`.
"""

from __future__ import annotations

import multiprocessing
import os
import pathlib
import shutil
import signal
from collections.abc import Callable
from typing import Any

import numpy as np

from shoal.train.checkpoint import save_checkpoint


def processes() -> Any:
    """The multiprocessing context whose processes fork from a server that imported shoal's
    checkpoint module (and torch); a process then imports only this small module. (The
    server cannot preload this module itself: it does not get the tests' ``sys.path``.)"""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["shoal.train.checkpoint"])
    return context


def save_back_to_back(run: str) -> None:
    """Save checkpoints of about 3 MB back to back, going on from the run's latest, until
    killed."""
    big = np.random.default_rng(0).normal(size=(400_000,))
    latest = pathlib.Path(run, "checkpoints", "latest")
    step = int(latest.read_text().removeprefix("step_")) if latest.exists() else 0
    while True:
        step += 1
        save_checkpoint(run, step, "ppo", {"step": step}, {"step": step, "big": big + step}, keep=2)


def save_three_killed_at(run: str, at: int) -> None:
    """Save steps 1 and 2, then step 3 killed (SIGKILL) before the ``at``-th of its disk steps
    (fsyncs, renames, removals); with fewer steps than ``at`` it runs through."""
    big = np.random.default_rng(0).normal(size=(1000,))
    save_checkpoint(run, 1, "ppo", {"step": 1}, {"step": 1, "big": big + 1}, keep=2)
    save_checkpoint(run, 2, "ppo", {"step": 2}, {"step": 2, "big": big + 2}, keep=2)
    calls = 0

    def killing(step: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            nonlocal calls
            calls += 1
            if calls == at:
                os.kill(os.getpid(), signal.SIGKILL)
            return step(*args, **kwargs)

        return call

    os.fsync, os.replace, shutil.rmtree = (  # type: ignore[assignment]
        killing(os.fsync),
        killing(os.replace),
        killing(shutil.rmtree),
    )
    save_checkpoint(run, 3, "ppo", {"step": 3}, {"step": 3, "big": big + 3}, keep=2)
