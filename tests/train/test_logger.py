import csv
import io
import json
import math

import numpy as np
import pytest
import torch
from rich.console import Console
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from shoal.train.logger import (
    ConsoleLogger,
    CsvLogger,
    JsonlLogger,
    Logger,
    MultiLogger,
    TensorBoardLogger,
    make_loggers,
)


def read_jsonl(path):
    # json.loads accepts bare NaN by default; parse_constant makes it reject non-standard JSON.
    def reject(name):
        raise ValueError(f"non-standard JSON constant {name}")

    with open(path, encoding="utf-8") as f:
        return [json.loads(line, parse_constant=reject) for line in f]


def read_csv(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.reader(f))


def plain_console():
    # A StringIO is not a TTY, so the console logger takes its plain-line path.
    return Console(file=io.StringIO(), width=200)


def test_jsonl_lines_contain_step_and_metrics(tmp_path):
    logger = JsonlLogger(tmp_path / "metrics.jsonl")
    logger.log({"loss": 0.5, "episodes": 3}, step=10)
    logger.log({"loss": np.float32(0.25), "lr": torch.tensor(1e-3)}, step=20)
    logger.close()

    first, second = read_jsonl(tmp_path / "metrics.jsonl")
    assert first == {"step": 10, "loss": 0.5, "episodes": 3}
    assert second["step"] == 20
    assert second["loss"] == pytest.approx(0.25)
    assert second["lr"] == pytest.approx(1e-3)


def test_jsonl_non_finite_values_stay_valid_json(tmp_path):
    logger = JsonlLogger(tmp_path / "metrics.jsonl")
    logger.log({"loss": float("nan"), "grad": float("inf"), "neg": -math.inf, "ok": 1.0}, step=1)
    logger.close()

    (record,) = read_jsonl(tmp_path / "metrics.jsonl")
    assert record == {"step": 1, "loss": "nan", "grad": "inf", "neg": "-inf", "ok": 1.0}
    assert math.isnan(float(record["loss"]))
    assert float(record["neg"]) == -math.inf


def test_jsonl_is_flushed_before_close(tmp_path):
    logger = JsonlLogger(tmp_path / "metrics.jsonl")
    logger.log({"loss": 1.0}, step=1)
    # Read while the logger is still open, as after a crash.
    assert read_jsonl(tmp_path / "metrics.jsonl") == [{"step": 1, "loss": 1.0}]
    logger.close()


def test_step_is_a_reserved_metric_name(tmp_path):
    logger = JsonlLogger(tmp_path / "metrics.jsonl")
    with pytest.raises(ValueError, match="reserved"):
        logger.log({"step": 1.0}, step=1)
    logger.close()


def test_csv_widens_header_when_new_key_appears(tmp_path):
    path = tmp_path / "metrics.csv"
    logger = CsvLogger(path)
    logger.log({"loss": 0.5, "episode/return": 10.0}, step=100)
    logger.log({"loss": 0.4}, step=200)
    assert read_csv(path) == [
        ["step", "loss", "episode/return"],
        ["100", "0.5", "10.0"],
        ["200", "0.4", ""],
    ]

    # An eval metric appears for the first time: the earlier rows get an empty cell.
    logger.log({"loss": 0.3, "eval/return": np.float64(50.0)}, step=300)
    logger.log({"episode/return": 12.0, "loss": 0.2}, step=400)
    logger.close()

    assert read_csv(path) == [
        ["step", "loss", "episode/return", "eval/return"],
        ["100", "0.5", "10.0", ""],
        ["200", "0.4", "", ""],
        ["300", "0.3", "", "50.0"],
        ["400", "0.2", "12.0", ""],
    ]
    assert not (tmp_path / "metrics.csv.tmp").exists()


def test_tensorboard_writes_readable_scalars(tmp_path):
    logger = TensorBoardLogger(tmp_path / "tb")
    logger.log({"train/loss": torch.tensor(0.75)}, step=5)
    logger.log({"train/loss": 0.5}, step=10)
    logger.close()

    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    scalars = events.Scalars("train/loss")
    assert [s.step for s in scalars] == [5, 10]
    assert [s.value for s in scalars] == pytest.approx([0.75, 0.5])


def test_a_new_run_in_a_killed_starts_directory_shows_only_its_own_curves(tmp_path):
    """A start killed before its first checkpoint left events at steps 5 and 10; the new run
    in the same directory (not a resume) writes from step 1, and only its points remain."""
    old = TensorBoardLogger(tmp_path / "tb")
    old.log({"train/loss": 9.0}, step=5)
    old.log({"train/loss": 9.0}, step=10)
    old.close()
    new = TensorBoardLogger(tmp_path / "tb")
    new.log({"train/loss": 1.0}, step=1)
    new.close()
    assert len(list((tmp_path / "tb").glob("events.out.tfevents.*"))) == 1
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert [(s.step, s.value) for s in events.Scalars("train/loss")] == [(1, 1.0)]


def test_console_plain_line_when_not_a_tty(tmp_path):
    console = plain_console()
    logger = ConsoleLogger(total_steps=100_000, every_s=3600.0, console=console)
    logger.log(
        {"perf/env_steps_per_s": 120345.0, "episode/return": 312.42, "eval/return": 500.0},
        step=40960,
    )
    # Within every_s of the first line: recorded but not printed.
    logger.log({"perf/env_steps_per_s": 120000.0}, step=81920)
    lines = console.file.getvalue().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("steps 40960/100000 | 120,345 steps/s | return 312.4 | eval 500.0")
    assert "\x1b" not in lines[0]  # no terminal control codes in CI logs

    # close() always prints the final state, keeping the last seen returns.
    logger.close()
    lines = console.file.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[1].startswith("steps 81920/100000 | 120,000 steps/s | return 312.4 | eval 500.0")


def test_console_plain_line_without_total_or_optional_metrics(capsys):
    logger = ConsoleLogger(total_steps=None, every_s=0.0)
    logger.log({}, step=7)
    logger.close()
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("steps 7 | ")
    assert "return" not in out[0]
    assert len(out) == 1  # close() does not print the last line a second time


def test_console_live_display_on_a_terminal():
    console = Console(file=io.StringIO(), force_terminal=True, width=160)
    logger = ConsoleLogger(total_steps=1000, console=console)
    logger.log({"perf/env_steps_per_s": 2500.0, "episode/return": 42.0}, step=500)
    logger.close()
    out = console.file.getvalue()
    assert "500/1000" in out
    assert "2,500 steps/s" in out
    assert "return 42.0" in out


def test_multi_logger_fans_out_and_closes_all():
    class Recorder:
        def __init__(self):
            self.calls = []
            self.closed = False

        def log(self, metrics, step):
            self.calls.append((dict(metrics), step))

        def close(self):
            self.closed = True

    class FailsOnClose(Recorder):
        def close(self):
            raise RuntimeError("boom")

    first, broken, last = Recorder(), FailsOnClose(), Recorder()
    assert isinstance(first, Logger)
    multi = MultiLogger([first, broken, last])
    multi.log({"a": 1.0}, step=3)
    assert first.calls == last.calls == broken.calls == [({"a": 1.0}, 3)]

    with pytest.raises(RuntimeError, match="boom"):
        multi.close()
    # A failing logger does not stop the others from closing.
    assert first.closed and last.closed


def test_make_loggers_creates_run_files(tmp_path):
    run_dir = tmp_path / "run"
    with make_loggers(run_dir, total_steps=10, console=False) as loggers:
        loggers.log({"loss": 1.0}, step=1)

    assert [type(logger) for logger in loggers.loggers] == [
        JsonlLogger,
        CsvLogger,
        TensorBoardLogger,
    ]
    assert read_jsonl(run_dir / "metrics.jsonl") == [{"step": 1, "loss": 1.0}]
    assert read_csv(run_dir / "metrics.csv") == [["step", "loss"], ["1", "1.0"]]
    assert list((run_dir / "tb").glob("events.out.tfevents.*"))

    with_console = make_loggers(tmp_path / "run2", total_steps=10, tensorboard=False)
    assert isinstance(with_console.loggers[-1], ConsoleLogger)
    assert not (tmp_path / "run2" / "tb").exists()
    with_console.close()


def test_resume_cuts_every_metric_file_back_to_the_checkpoint(tmp_path):
    """A run that logged steps 1-5 and resumes from a checkpoint at step 3: the rows of steps
    4 and 5 (and a half-written last line) are dropped, counted in lost_steps, and the
    resumed run's rows follow without duplicates in JSONL, CSV and TensorBoard."""
    first = make_loggers(tmp_path, total_steps=10, console=False, tensorboard=True)
    for step in range(1, 6):
        first.log({"loss/total": float(step)}, step)
    first.close()
    with open(tmp_path / "metrics.jsonl", "a") as partial:
        partial.write('{"step": 6, "loss/to')  # killed mid-line
    resumed = make_loggers(tmp_path, total_steps=10, console=False, tensorboard=True, resume_step=3)
    assert resumed.lost_steps == 2  # steps 4 and 5 (the torn line is dropped too)
    for step in range(4, 8):
        resumed.log({"loss/total": float(10 * step)}, step)
    resumed.close()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 3, 4, 5, 6, 7]
    with open(tmp_path / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(float(r["step"])) for r in rows] == [1, 2, 3, 4, 5, 6, 7]
    assert float(rows[3]["loss/total"]) == 40.0
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    scalars = events.Scalars("loss/total")
    assert [s.step for s in scalars] == [1, 2, 3, 4, 5, 6, 7]
    assert [s.value for s in scalars][3:] == [40.0, 50.0, 60.0, 70.0]


def test_console_shows_each_group_and_the_evaluation_rates():
    """Opposing groups each with their return (never the mean over both), a game's wins per
    seat and the env's own rates."""
    console = plain_console()
    logger = ConsoleLogger(total_steps=100, every_s=0.0, console=console, groups=["pred", "prey"])
    logger.log({"episode/return": 0.0, "episode/return/pred": 4.0, "episode/return/prey": -4.0,
                "eval/return": 0.5, "eval/return/pred": 6.0, "eval/return/prey": -5.0,
                "eval/return_low/pred": 5.0, "eval/return_high/pred": 7.0,
                "eval/return_low/prey": -6.0, "eval/return_high/prey": -4.0,
                "eval/win/pred": 0.75, "eval/collision_rate": 0.25}, step=10)  # fmt: skip
    logger.close()
    line = console.file.getvalue().splitlines()[-1]
    assert "| return pred 4.0 prey -4.0 | eval pred 6.0 [5.0, 7.0] prey -5.0 [-6.0, -4.0] |" in line
    assert "win pred 0.75 collision 0.25" in line and "eval 0.5" not in line


def test_console_line_estimates_the_time_left(monkeypatch):
    """The steps to go at the run's wall-clock pace since its first logged iteration (a run
    under a second old: its whole pace); an offline learner's line counts updates."""
    import importlib
    from types import SimpleNamespace

    progress = importlib.import_module("shoal.train.progress")
    clock = iter([0.0, 0.0, 10.0])  # construction, then each log
    monkeypatch.setattr(progress, "time", SimpleNamespace(monotonic=lambda: next(clock)))
    console = plain_console()
    logger = ConsoleLogger(total_steps=1000, every_s=0.0, console=console, unit="update")
    logger.log({}, step=100)
    logger.log({}, step=300)  # 20 updates/s on average: 700 to go take 35 s
    lines = console.file.getvalue().splitlines()
    assert lines[-1].startswith("updates 300/1000 | 20 updates/s")
    assert lines[-1].endswith("0:00:10, 0:00:35 left")


def test_time_left_follows_the_recent_pace_after_a_fast_warm_up(monkeypatch):
    """A replay learner's random warm-up runs far faster than its training steps: the
    estimate follows the pace of the last quarter of the run, not the average since its
    start (which said 5 minutes left for SAC on HalfCheetah when 18 were)."""
    import importlib
    from types import SimpleNamespace

    progress = importlib.import_module("shoal.train.progress")
    now = [0.0]
    monkeypatch.setattr(progress, "time", SimpleNamespace(monotonic=lambda: now[0]))
    console = plain_console()
    logger = ConsoleLogger(total_steps=100_000, every_s=0.0, console=console)
    # 10,000 warm-up steps in 3 s (logged every second), then 80 steps/s.
    for t in range(4):
        now[0] = float(t)
        logger.log({}, step=min(10_000, 3_334 * t))
    for t in range(4, 41):
        now[0] = float(t)
        logger.log({}, step=10_000 + 80 * (t - 3))
    # At 40 s: 12,960 steps; the last quarter (10 s) ran at 80 steps/s, so the 87,040 to go
    # take 1,088 s. The average since the start (324 steps/s) would say 269 s.
    line = console.file.getvalue().splitlines()[-1]
    assert line.startswith("steps 12960/100000")
    assert line.endswith("0:00:40, 0:18:08 left")


def test_countdown_says_nothing_for_short_work_then_a_line_with_the_time_left(monkeypatch):
    """``shoal eval``'s and ``shoal collect``'s progress: nothing within ``after_s`` (short
    evaluations print as before), then at most a line per ``every_s`` with the count to go at
    the average pace since the start."""
    import importlib
    from types import SimpleNamespace

    progress = importlib.import_module("shoal.train.progress")
    now = [0.0]
    monkeypatch.setattr(progress, "time", SimpleNamespace(monotonic=lambda: now[0]))
    console = plain_console()
    with progress.Countdown(10, "episodes", console, every_s=10.0, after_s=2.0) as tick:
        now[0] = 1.0
        tick(0)  # within after_s: nothing
        assert console.file.getvalue() == ""
        now[0] = 3.0
        tick(0)  # nothing finished yet: no estimate
        now[0] = 8.0
        tick(2)  # within every_s of the last line: nothing
        now[0] = 20.0
        tick(4)  # 4 in 20 s: 6 to go take 30 s
    lines = console.file.getvalue().splitlines()
    assert lines == ["episodes 0/10 | 0:00:03", "episodes 4/10 | 0:00:20, 0:00:30 left"]
    assert tick.lines == 2


def test_countdown_draws_a_bar_on_a_terminal_and_clears_it():
    import io

    from shoal.train.progress import Countdown

    console = Console(file=io.StringIO(), force_terminal=True, width=100)
    with Countdown(4, "games", console, after_s=0.0) as tick:
        for done in range(5):
            tick(done)
        assert tick._progress is not None  # the live bar is up
    assert tick._progress is None and tick.lines == 0
    assert "games" in console.file.getvalue()
