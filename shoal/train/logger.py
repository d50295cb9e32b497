"""Metric loggers for training runs.

Every logger takes a flat mapping of metric name to scalar plus the global env-step count.
Values may be Python numbers, numpy scalars or 0-d torch tensors; they are converted with
``float()`` here so that callers can pass whatever their loss/statistics code produced without
sprinkling ``.item()`` calls around the training loop.

File loggers flush on every call so that a crashed or killed run still leaves a complete log up
to its last iteration. The console's progress display is `shoal.train.progress`.
"""

from __future__ import annotations

import csv
import json
import math
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from shoal.train.progress import ConsoleLogger

__all__ = [
    "ConsoleLogger",
    "CsvLogger",
    "JsonlLogger",
    "Logger",
    "MultiLogger",
    "TensorBoardLogger",
    "make_loggers",
]


@runtime_checkable
class Logger(Protocol):
    """Anything that can record a step's metrics and be closed at the end of a run."""

    def log(self, metrics: Mapping[str, float], step: int) -> None: ...

    def close(self) -> None: ...


def scalar(value: Any) -> float | int:
    """Convert a metric value to a plain Python number.

    Python ints are kept as ints so counters (episodes, updates) read back exactly; everything
    else, including numpy scalars and 0-d tensors, goes through ``float()``.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return float(value)


def _check_no_step_key(metrics: Mapping[str, Any]) -> None:
    # "step" is the name of the step column/field in the file loggers; a metric with the same
    # name would silently overwrite it (JSON) or collide with it (CSV).
    if "step" in metrics:
        raise ValueError("'step' is reserved for the step count; rename the metric")


class JsonlLogger:
    """Append one JSON object per ``log`` call: ``{"step": step, **metrics}``.

    JSON has no NaN or infinity, and writing Python's bare ``NaN`` would make the line
    unparseable for strict readers. Non-finite values are therefore written as the strings
    ``"nan"``, ``"inf"`` and ``"-inf"`` rather than ``null``, so a diverged loss stays
    distinguishable from a missing one; ``float()`` turns each of them back into the number.
    """

    def __init__(self, path: str | os.PathLike[str], resume_step: int | None = None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.lost_steps = 0
        """How far the file ran past ``resume_step`` (rows dropped on resume)."""
        append = resume_step is not None and self.path.exists()
        if resume_step is not None and append:
            self.lost_steps = _truncate_jsonl(self.path, resume_step)
        # The file stays open for the whole run (closed in close()), hence no `with` block.
        # A resumed run appends, so its log continues the original one.
        self._file = open(self.path, "a" if append else "w", encoding="utf-8")  # noqa: SIM115

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        _check_no_step_key(metrics)
        record: dict[str, Any] = {"step": int(step)}
        for key, value in metrics.items():
            record[key] = self._json_value(value)
        # allow_nan=False guarantees every line is standard JSON: it raises rather than
        # writing NaN if a non-finite value ever slipped past _json_value.
        self._file.write(json.dumps(record, allow_nan=False) + "\n")
        # flush() hands the line to the OS, which is enough to survive a crash of this process.
        self._file.flush()

    @staticmethod
    def _json_value(value: Any) -> float | int | str:
        number = scalar(value)
        if isinstance(number, float) and not math.isfinite(number):
            if math.isnan(number):
                return "nan"
            return "inf" if number > 0 else "-inf"
        return number

    def close(self) -> None:
        self._file.close()


class CsvLogger:
    """Write metrics as CSV with a ``step`` column followed by metric columns.

    Metric keys may appear after the first row (evaluation metrics only show up at evaluation
    time). When that happens the file is rewritten with the widened header; earlier rows get
    empty cells for the new columns, and rows that lack a known key get an empty cell too.
    Rewriting is fine because new keys are rare and metric files are small.
    """

    def __init__(self, path: str | os.PathLike[str], resume_step: int | None = None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fields: list[str] = ["step"]
        # The header is written with the first row, whose keys are the first columns we know.
        self._header_written = False
        self.lost_steps = 0
        """How far the file ran past ``resume_step`` (rows dropped on resume)."""
        append = resume_step is not None and self.path.exists()
        if resume_step is not None and append:
            self.lost_steps = _truncate_csv(self.path, resume_step)
        if append and self.path.stat().st_size:
            # A resumed run continues the file under its existing header.
            with open(self.path, newline="", encoding="utf-8") as existing:
                self._fields = next(csv.reader(existing))
            self._header_written = True
        self._known: set[str] = set(self._fields)
        mode = "a" if self._header_written else "w"
        self._file = open(self.path, mode, newline="", encoding="utf-8")  # noqa: SIM115
        self._writer = self._make_writer()

    def _make_writer(self) -> csv.DictWriter:
        return csv.DictWriter(self._file, fieldnames=self._fields, restval="")

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        _check_no_step_key(metrics)
        new_keys = [key for key in metrics if key not in self._known]
        if new_keys:
            self._fields.extend(new_keys)
            self._known.update(new_keys)
            if self._header_written:
                self._rewrite_with_current_header()
            else:
                self._writer = self._make_writer()
        if not self._header_written:
            self._writer.writeheader()
            self._header_written = True

        row: dict[str, Any] = {"step": int(step)}
        for key, value in metrics.items():
            row[key] = scalar(value)
        self._writer.writerow(row)
        self._file.flush()

    def _rewrite_with_current_header(self) -> None:
        """Copy the existing rows into a file with the widened header, then swap it in."""
        self._file.close()
        tmp_path = self.path.with_name(self.path.name + ".tmp")
        with (
            open(self.path, newline="", encoding="utf-8") as src,
            open(tmp_path, "w", newline="", encoding="utf-8") as dst,
        ):
            writer = csv.DictWriter(dst, fieldnames=self._fields, restval="")
            writer.writeheader()
            # Stream row by row: the old rows are copied verbatim, the new columns left empty.
            writer.writerows(csv.DictReader(src))
        # os.replace is atomic, so a crash mid-rewrite leaves the old, complete file in place.
        os.replace(tmp_path, self.path)
        self._file = open(self.path, "a", newline="", encoding="utf-8")  # noqa: SIM115
        self._writer = self._make_writer()

    def close(self) -> None:
        self._file.close()


def _truncate_jsonl(path: Path, resume_step: int) -> int:
    """Drop the records after ``resume_step`` (and a line cut short by a crash); returns how
    many env steps past ``resume_step`` the file had run."""
    kept, last = [], resume_step
    with open(path, encoding="utf-8") as src:
        for line in src:
            try:
                step = int(json.loads(line)["step"])
            except (ValueError, KeyError, TypeError):
                continue
            if step <= resume_step:
                kept.append(line if line.endswith("\n") else line + "\n")
            last = max(last, step)
    _replace_lines(path, kept)
    return last - resume_step


def _truncate_csv(path: Path, resume_step: int) -> int:
    """`_truncate_jsonl` for a CSV file with a ``step`` column (its header kept)."""
    with open(path, newline="", encoding="utf-8") as src:
        rows = list(csv.reader(src))
    if not rows:
        return 0
    header, kept, last = rows[0], [rows[0]], resume_step
    for row in rows[1:]:
        try:
            step = int(row[0])
        except (ValueError, IndexError):
            continue
        if len(row) != len(header):
            continue  # cut short by a crash
        if step <= resume_step:
            kept.append(row)
        last = max(last, step)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="", encoding="utf-8") as dst:
        csv.writer(dst).writerows(kept)
    os.replace(tmp, path)
    return last - resume_step


def _replace_lines(path: Path, lines: list[str]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(lines), encoding="utf-8")
    os.replace(tmp, path)


def _after_existing_events(log_dir: Path) -> None:
    """Wait, if need be, until this second is past every event file's in ``log_dir``.
    TensorBoard reads a directory's event files in name order, and a name starts with the
    second it was made in: a resumed run's file made within the same second as the
    interrupted one's could sort before it (by the writer's counter, compared as text), and
    the resume's purge of the steps after its checkpoint would then come first and purge
    nothing."""
    seconds = []
    for path in log_dir.glob("events.out.tfevents.*"):
        stamp = path.name.split(".")[3]
        if stamp.isdigit():
            seconds.append(int(stamp))
    if seconds and max(seconds) >= int(time.time()):
        time.sleep(max(seconds) + 1 - time.time())


class TensorBoardLogger:
    """Write each metric as a TensorBoard scalar under its own name. On resume
    (``resume_step``), events logged after that step by the interrupted run are purged, so
    the curves do not double back; a new run removes the event files a start killed before
    its first checkpoint left in the same directory, so old curves never mix in."""

    def __init__(self, log_dir: str | os.PathLike[str], resume_step: int | None = None) -> None:
        # Imported here so that runs without TensorBoard logging don't pay for importing it.
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = Path(log_dir)
        if resume_step is None:
            for stale in self.log_dir.glob("events.out.tfevents.*"):
                stale.unlink()
        else:
            _after_existing_events(self.log_dir)
        purge = None if resume_step is None else resume_step + 1
        self._writer = SummaryWriter(log_dir=str(self.log_dir), purge_step=purge)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        for key, value in metrics.items():
            self._writer.add_scalar(key, float(value), global_step=int(step))

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        # SummaryWriter buffers events and only flushes periodically; make sure all are on disk.
        self._writer.flush()
        self._writer.close()


class MultiLogger:
    """Send every call to several loggers."""

    def __init__(self, loggers: Iterable[Logger]) -> None:
        self.loggers: list[Logger] = list(loggers)

    @property
    def lost_steps(self) -> int:
        """Env steps the metric files had run past the step a resumed run restarts from."""
        return max((getattr(logger, "lost_steps", 0) for logger in self.loggers), default=0)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        for logger in self.loggers:
            logger.log(metrics, step)

    def artifacts(self, config: Path, checkpoint: Path | None) -> None:
        """At the end of a run: the experiment trackers (W&B, MLflow) keep the config file
        and the final checkpoint."""
        for logger in self.loggers:
            keep = getattr(logger, "artifacts", None)
            if keep is not None:
                keep(config, checkpoint)

    def flush(self) -> None:
        """Put what buffering loggers (TensorBoard) hold on disk: called with each checkpoint,
        so that a killed run's logs reach at least its last checkpoint."""
        for logger in self.loggers:
            flush = getattr(logger, "flush", None)
            if flush is not None:
                flush()

    def close(self) -> None:
        # Close every logger even if one fails, so the others still flush their files.
        first_error: BaseException | None = None
        for logger in self.loggers:
            try:
                logger.close()
            except Exception as error:
                if first_error is None:
                    first_error = error
        if first_error is not None:
            raise first_error

    def __enter__(self) -> MultiLogger:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def make_loggers(
    run_dir: Path,
    total_steps: int | None,
    console: bool = True,
    tensorboard: bool = True,
    resume_step: int | None = None,
    trackers: Iterable[Logger] = (),
    groups: Sequence[str] = (),
    unit: str = "env step",
) -> MultiLogger:
    """The standard set of loggers for a run directory.

    Creates ``run_dir/metrics.jsonl``, ``run_dir/metrics.csv``, TensorBoard events under
    ``run_dir/tb/`` (if ``tensorboard``) and a console progress display (if ``console``).
    A run resumed from a checkpoint at env step ``resume_step`` continues the files, without
    what the interrupted run logged after that step (`MultiLogger.lost_steps` says how much).
    ``trackers`` (`shoal.train.trackers`) log beside them. ``groups``: the agent groups of
    a run whose groups act together, each shown with its own evaluation return. ``unit``:
    what the steps count, for the console ("env step", "update").
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    loggers: list[Logger] = [
        JsonlLogger(run_dir / "metrics.jsonl", resume_step=resume_step),
        CsvLogger(run_dir / "metrics.csv", resume_step=resume_step),
    ]
    if tensorboard:
        loggers.append(TensorBoardLogger(run_dir / "tb", resume_step=resume_step))
    loggers.extend(trackers)
    if console:
        loggers.append(ConsoleLogger(total_steps, groups=groups, unit=unit))
    return MultiLogger(loggers)
