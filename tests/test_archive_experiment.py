"""benchmarks/archive_experiment.py: a finished run's metrics thinned without changing what
the comparisons read from them, and an archive that resumes only what it holds."""

import json

import pytest

from tests.benchmark_scripts import load_benchmark


@pytest.fixture(scope="module")
def archiver():
    return load_benchmark("archive_experiment")


ROWS = [
    {"step": 64, "perf/iteration_s": 0.5, "loss/critic": 2.0},
    {"step": 128, "episode/return": 1.0, "episode/count": 1, "perf/iteration_s": 0.25,
     "loss/critic": 4.0},
    {"step": 192, "episode/return": 5.0, "episode/count": 3, "perf/iteration_s": 0.25},
    {"step": 200, "eval/return": 7.0},
    {"step": 256, "episode/return": -2.0, "episode/count": 2, "perf/iteration_s": 1.0},
]  # fmt: skip


def test_thin_by_hand(archiver):
    out = archiver.thin(ROWS, window=1000)
    # the evaluation row closes the first group and stays as it was
    assert out[1] == {"step": 200, "eval/return": 7.0}
    first = out[0]
    assert first["step"] == 192
    assert first["episode/count"] == 4
    assert first["episode/return"] == pytest.approx((1.0 * 1 + 5.0 * 3) / 4)  # by episodes
    assert first["perf/iteration_s"] == pytest.approx(1.0)  # summed: wall-clock stays exact
    assert first["loss/critic"] == pytest.approx(3.0)  # plain mean of the rows that had it
    assert out[2] == {"step": 256, "episode/return": -2.0, "episode/count": 2.0,
                      "perf/iteration_s": 1.0}  # fmt: skip
    assert len(out) == 3


def test_thin_windows_and_rows_without_episodes(archiver):
    out = archiver.thin([r for r in ROWS if "eval/return" not in r], window=128)
    # steps 64 | 128, 192 | 256 fall in windows 0 | 1 | 2
    assert [r["step"] for r in out] == [64, 192, 256]
    assert not any(k.startswith("episode/") for k in out[0])
    assert out[1]["episode/return"] == pytest.approx(4.0)
    total = sum(r["perf/iteration_s"] for r in out)
    assert total == pytest.approx(sum(r.get("perf/iteration_s", 0) for r in ROWS))


def test_archive_keeps_finished_runs_only(archiver, tmp_path):
    source, dest = tmp_path / "src", tmp_path / "dest"
    (source / "configs").mkdir(parents=True)
    (source / "experiment.json").write_text(json.dumps({"name": "x"}))
    (source / "configs" / "a-s0.yaml").write_text("algo: ppo\n")
    status = {"a-s0": {"state": "done"}, "a-s1": {"state": "running"}}
    (source / "status.json").write_text(json.dumps(status))
    for name in status:
        run = source / name
        (run / "checkpoints").mkdir(parents=True)
        (run / "checkpoints" / "latest").write_text("step_1")
        (run / "config.json").write_text("{}")
        (run / "final_rates.json").write_text('{"low": 1}')
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    assert archiver.archive(source, dest, window=1000) == ["a-s0"]
    assert archiver.archive(source, dest, window=1000) == []  # unchanged: nothing rewritten
    kept = dest / "a-s0"
    assert sorted(p.name for p in kept.iterdir()) == [
        "config.json", "final_rates.json", "metrics.jsonl"
    ]  # fmt: skip
    assert not (dest / "a-s1").exists()
    assert json.loads((dest / "status.json").read_text()) == status
    assert (dest / "configs" / "a-s0.yaml").exists()
    # a run done at the source but lost before it was archived runs again from the archive
    (source / "a-s1" / "metrics.jsonl").unlink()
    status["a-s1"]["state"] = "done"
    (source / "status.json").write_text(json.dumps(status))
    (source / "a-s1").rename(tmp_path / "gone")
    archiver.archive(source, dest, window=1000)
    assert json.loads((dest / "status.json").read_text())["a-s1"]["state"] == "pending"
