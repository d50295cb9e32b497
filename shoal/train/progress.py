"""The console's progress display of a training run: a live bar on a terminal, a plain line
at most every second elsewhere (`ConsoleLogger`)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping, Sequence
from datetime import timedelta

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

__all__ = ["ConsoleLogger", "Countdown", "eval_rates"]

# Metric names the console logger knows how to summarise.
STEPS_PER_S_KEY = "perf/env_steps_per_s"
RETURN_KEY = "episode/return"
EVAL_RETURN_KEY = "eval/return"

# A live terminal display is redrawn at most this often; faster redraws cost training time
# without being readable.
_LIVE_REFRESH_PER_S = 10
_RECENT = 0.25
"""The time left is read from the pace over this fraction of the time since the first log."""
_PACE_SAMPLE_S = 1.0
"""At most one (step, time) sample a second is kept for the pace."""


def _interval(metrics: Mapping[str, float], group: str) -> str:
    """`` [low, high]``: a group's evaluation interval, where the metrics have it."""
    low, high = metrics.get(f"eval/return_low/{group}"), metrics.get(f"eval/return_high/{group}")
    return "" if low is None or high is None else f" [{low:.1f}, {high:.1f}]"


def eval_rates(metrics: Mapping[str, float]) -> str:
    """The evaluation's rates for the progress line: a game's wins per seat or group
    (``eval/win/<name>``) and the env's own rates (``eval/<name>_rate``: a traffic env's
    completion and collision rates), e.g. ``win player_1 0.70 player_2 0.20``."""
    wins = [f"{k.removeprefix('eval/win/')} {v:.2f}" for k, v in metrics.items()
            if k.startswith("eval/win/")]  # fmt: skip
    rates = [f"{k.removeprefix('eval/').removesuffix('_rate')} {v:.2f}" for k, v in metrics.items()
             if k.startswith("eval/") and k.endswith("_rate") and k.count("/") == 1]  # fmt: skip
    return " ".join((["win", *wins] if wins else []) + rates)


class ConsoleLogger:
    """Human-readable progress on the console.

    On a terminal this is a live ``rich`` progress bar showing env steps / total, env-steps/s,
    the latest ``episode/return`` and ``eval/return``, the elapsed time and an estimate of the
    time left. Elsewhere (CI logs, pipes) a live display would spam control codes, so a plain
    line is printed at most every ``every_s`` seconds, and once more on ``close``::

        steps 40960/100000 | 120,345 steps/s | return 312.4 | eval 500.0 | 0:00:01, 0:00:02 left

    The time left is the steps to go at the run's recent wall-clock pace: over the last
    quarter of the time since its first logged iteration (evaluations and checkpoints
    included), so a phase that runs at another pace (a replay learner's random warm-up steps
    before its first update) stops counting once it is over. ``unit`` names what the steps
    count: "env step" (shown as "steps"), or "update" for an offline learner.

    The steps/s figure is ``perf/env_steps_per_s`` when the trainer reports it, otherwise the
    average rate since the first ``log`` call. ``log`` is cheap: it records the values and only
    touches the display when a redraw is due.
    """

    def __init__(
        self,
        total_steps: int | None,
        every_s: float = 1.0,
        console: Console | None = None,
        groups: Sequence[str] = (),
        unit: str = "env step",
    ) -> None:
        self.total_steps = total_steps
        self.label = "steps" if unit == "env step" else f"{unit}s"
        self.groups = list(groups) if len(groups) > 1 else []
        """Several groups: each group's evaluation return is shown, never their mean."""
        self.every_s = every_s
        self._console = console if console is not None else Console()
        self._live = self._console.is_terminal
        self._min_interval_s = 1.0 / _LIVE_REFRESH_PER_S if self._live else every_s

        # Elapsed time counts from construction, i.e. from the start of the run, not from the
        # first (possibly slow) training iteration.
        self._start_time = time.monotonic()
        self._next_render_time = 0.0
        self._step: int | None = None
        # (step, time) of the first log call, the baseline for the fallback steps/s estimate.
        self._rate_origin: tuple[int, float] | None = None
        # (step, time) samples, at most one a second, from which the recent pace is read.
        self._pace: deque[tuple[int, float]] = deque()
        self._reported_rate: float | None = None
        self._return: float | None = None
        self._eval_return: float | None = None
        self._eval_rates = ""
        self._eval_groups = ""
        self._groups_return = ""
        self._rendered: tuple | None = None
        self._closed = False

        self._progress: Progress | None = None
        self._task: TaskID | None = None
        self._display_started = False
        if self._live:
            self._progress = Progress(
                TextColumn(self.label),
                MofNCompleteColumn(),
                BarColumn(),
                TextColumn("{task.fields[rate]}", markup=False),
                TextColumn("{task.fields[returns]}", markup=False),
                TimeElapsedColumn(),
                TextColumn("{task.fields[left]}", markup=False),
                console=self._console,
                refresh_per_second=_LIVE_REFRESH_PER_S,
            )
            # Adding the task now (without starting the display) starts its elapsed clock now.
            self._task = self._progress.add_task(
                "train", total=total_steps, rate="", returns="", left=""
            )

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        now = time.monotonic()
        self._step = int(step)
        if self._rate_origin is None:
            self._rate_origin = (self._step, now)
        if not self._pace or now - self._pace[-1][1] >= _PACE_SAMPLE_S:
            self._pace.append((self._step, now))
        # Returns are only reported on iterations where episodes finished, so keep the last one.
        if STEPS_PER_S_KEY in metrics:
            self._reported_rate = float(metrics[STEPS_PER_S_KEY])
        if RETURN_KEY in metrics:
            self._return = float(metrics[RETURN_KEY])
            self._groups_return = self._per_group(metrics, RETURN_KEY)
        if EVAL_RETURN_KEY in metrics:
            self._eval_return = float(metrics[EVAL_RETURN_KEY])
            self._eval_rates = eval_rates(metrics)
            self._eval_groups = " ".join(
                f"{g} {metrics[f'{EVAL_RETURN_KEY}/{g}']:.1f}" + _interval(metrics, g)
                for g in self.groups
                if f"{EVAL_RETURN_KEY}/{g}" in metrics
            )

        if now >= self._next_render_time:
            self._next_render_time = now + self._min_interval_s
            self._render(now)

    def _per_group(self, metrics: Mapping[str, float], key: str) -> str:
        """``adversary 7.0 agent -7.5``: each group's ``key/<group>``, or "" with one group."""
        return " ".join(
            f"{g} {metrics[f'{key}/{g}']:.1f}" for g in self.groups if f"{key}/{g}" in metrics
        )

    def _render(self, now: float) -> None:
        if self._progress is not None and self._task is not None:
            if not self._display_started:
                # Started lazily so nothing is drawn (or left behind) if no step is ever logged.
                self._progress.start()
                self._display_started = True
            self._progress.update(
                self._task,
                completed=self._step,
                rate=self._rate_text(now),
                returns=" | ".join(self._return_parts()),
                left=self._left_text(now),
            )
        else:
            self._console.out(self.format_line(now), highlight=False)
        self._rendered = self._state()

    def _state(self) -> tuple:
        """What a progress line shows besides the clock: a line is not printed again for it."""
        return (self._step, self._return, self._eval_return, self._eval_rates)

    def _rate(self, now: float) -> float | None:
        if self._reported_rate is not None:
            return self._reported_rate
        if self._rate_origin is None or self._step is None:
            return None
        origin_step, origin_time = self._rate_origin
        if now <= origin_time:
            return None
        return (self._step - origin_step) / (now - origin_time)

    def _rate_text(self, now: float) -> str:
        rate = self._rate(now)
        return "" if rate is None else f"{rate:,.0f} {self.label}/s"

    def _time_left(self, now: float) -> float | None:
        """Seconds to ``total_steps`` at the pace of the last ``_RECENT`` of the time since
        the first log (the pace since the first log while that is under a second)."""
        if self.total_steps is None or self._rate_origin is None or self._step is None:
            return None
        # The window's start only moves forward, so samples before it are dropped for good.
        window_start = now - _RECENT * (now - self._rate_origin[1])
        while len(self._pace) > 1 and self._pace[1][1] <= window_start:
            self._pace.popleft()
        since_step, since_time = self._pace[0] if self._pace else self._rate_origin
        done = self._step - since_step
        if done <= 0 or now <= since_time:
            return None
        return max(0, self.total_steps - self._step) * (now - since_time) / done

    def _left_text(self, now: float) -> str:
        left = self._time_left(now)
        return "" if left is None else f"{timedelta(seconds=round(left))} left"

    def _return_parts(self) -> list[str]:
        parts = []
        if self._groups_return:
            parts.append(f"return {self._groups_return}")
        elif self._return is not None:
            parts.append(f"return {self._return:.1f}")
        if self._eval_groups:
            parts.append(f"eval {self._eval_groups}")
        elif self._eval_return is not None:
            parts.append(f"eval {self._eval_return:.1f}")
        if self._eval_rates:
            parts.append(self._eval_rates)
        return parts

    def format_line(self, now: float | None = None) -> str:
        """The plain progress line printed when the console is not a terminal."""
        now = time.monotonic() if now is None else now
        steps = f"{self.label} {self._step if self._step is not None else 0}"
        if self.total_steps is not None:
            steps += f"/{self.total_steps}"
        parts = [steps]
        rate_text = self._rate_text(now)
        if rate_text:
            parts.append(rate_text)
        parts.extend(self._return_parts())
        clock = str(timedelta(seconds=int(now - self._start_time)))
        left = self._left_text(now)
        parts.append(f"{clock}, {left}" if left else clock)
        return " | ".join(parts)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._step is None:
            # Nothing was logged, so there is no progress worth reporting.
            return
        now = time.monotonic()
        # Show the final state, even if the last log call fell inside the throttle window,
        # but not a second time where the last line already showed it.
        if self._progress is not None or self._rendered != self._state():
            self._render(now)
        if self._progress is not None:
            self._progress.stop()


class Countdown:
    """Progress toward a count of finished things (``shoal eval``'s episodes or games,
    ``shoal collect``'s episodes): called with the count so far as often as is convenient
    (every env step), it shows a bar with the time left on a terminal, or a plain line at most
    every ``every_s`` seconds elsewhere::

        episodes 3/10 | 0:00:12, 0:00:28 left

    Nothing shows for work done within ``after_s`` seconds, so short evaluations print as
    before. The time left is the count to go at the average pace since the start; it is
    unknown until the first thing has finished (episodes run side by side often end
    together). A context manager: leaving it clears the bar.
    """

    def __init__(
        self,
        total: int,
        label: str,
        console: Console | None = None,
        every_s: float = 10.0,
        after_s: float = 2.0,
    ) -> None:
        self.total, self.label, self.every_s, self.after_s = int(total), label, every_s, after_s
        self._console = console if console is not None else Console(stderr=True)
        self._start = time.monotonic()
        self._next = self._start + after_s
        self._done = 0
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        self.lines = 0
        """Plain lines printed (where the console is not a terminal)."""

    def __enter__(self) -> Countdown:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __call__(self, done: int) -> None:
        self._done = int(done)
        now = time.monotonic()
        if now < self._next:
            return
        if not self._console.is_terminal:
            self._next = now + self.every_s
            self._console.out(self.format_line(now), highlight=False)
            self.lines += 1
            return
        self._next = now + 1.0 / _LIVE_REFRESH_PER_S
        if self._progress is None:
            self._progress = Progress(
                TextColumn(self.label), MofNCompleteColumn(), BarColumn(), TimeElapsedColumn(),
                TimeRemainingColumn(), console=self._console, transient=True,
            )  # fmt: skip
            self._task = self._progress.add_task(self.label, total=self.total)
            self._progress.start()
        assert self._task is not None
        self._progress.update(self._task, completed=self._done)

    def time_left(self, now: float) -> float | None:
        """Seconds to ``total`` at the average pace since the start; None before the first."""
        if self._done <= 0 or now <= self._start:
            return None
        return max(0, self.total - self._done) * (now - self._start) / self._done

    def format_line(self, now: float | None = None) -> str:
        now = time.monotonic() if now is None else now
        clock = str(timedelta(seconds=int(now - self._start)))
        left = self.time_left(now)
        if left is not None:
            clock += f", {timedelta(seconds=round(left))} left"
        return f"{self.label} {self._done}/{self.total} | {clock}"

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
