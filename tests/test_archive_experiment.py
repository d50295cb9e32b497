"""benchmarks/archive_experiment.py: a finished run's metrics thinned without changing what
the comparisons read from them, and an archive that resumes only what it holds."""

import json
import shutil

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


def write_run(run, rows, checkpoints=()):
    """A run directory by hand: config, metrics, and the named checkpoints (the last one
    ``latest``)."""
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.json").write_text("{}")
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for name in checkpoints:
        (run / "checkpoints" / name).mkdir()
        (run / "checkpoints" / name / "state.pt").write_bytes(name.encode())
        (run / "checkpoints" / "latest").write_text(name)


def test_unfinished_keeps_a_stopped_runs_newest_checkpoint_and_its_metrics_up_to_it(
    archiver, tmp_path
):
    source, dest = tmp_path / "src", tmp_path / "dest"
    (source / "configs").mkdir(parents=True)
    (source / "experiment.json").write_text(json.dumps({"name": "x"}))
    status = {"a-s0": {"state": "interrupted", "steps": 200, "wall_before_s": 3.0},
              "a-s1": {"state": "pending"}}  # fmt: skip
    (source / "status.json").write_text(json.dumps(status))
    names = ["step_000000000128", "step_000000000192"]
    write_run(source / "a-s0", ROWS, names)
    write_run(source / "a-s1", ROWS[:1])  # started, stopped before its first checkpoint
    assert archiver.archive(source, dest, window=1) == []  # without --unfinished: nothing
    assert not (dest / "a-s0").exists()
    assert archiver.archive(source, dest, window=1, unfinished=True) == ["a-s0"]
    assert archiver.archive(source, dest, window=1, unfinished=True) == []  # kept already
    kept = dest / "a-s0" / "checkpoints"
    assert sorted(p.name for p in kept.iterdir()) == ["latest", names[1]]  # the newest alone
    assert (kept / names[1] / "state.pt").read_bytes() == names[1].encode()
    rows = [json.loads(line) for line in (dest / "a-s0" / "metrics.jsonl").read_text().splitlines()]
    # the rows past the checkpoint's step (192) are not kept: the resumed run logs them again
    assert [r["step"] for r in rows] == [64, 128, 192]
    assert not (dest / "a-s1").exists()  # no checkpoint: it starts again from nothing
    assert json.loads((dest / "status.json").read_text()) == status  # its wall-clock kept
    # once it is done, the archive holds its metrics and no checkpoint
    status["a-s0"] = {"state": "done", "steps": 256}
    (source / "status.json").write_text(json.dumps(status))
    assert archiver.archive(source, dest, window=1, unfinished=True) == ["a-s0"]
    assert not kept.exists()
    assert len((dest / "a-s0" / "metrics.jsonl").read_text().splitlines()) == len(ROWS)


def test_a_run_stopped_in_one_sitting_resumes_from_the_archive_in_the_next(archiver, tmp_path):
    """The checkpoint an unfinished archive keeps is enough to resume: restored on a
    checkout without the run directory, the run goes on from it and ends with the losses of
    a run that was never stopped."""
    from shoal.studies.experiment import run_experiment
    from shoal.studies.plan import plan

    small = {"run": {"total_steps": 512, "eval_every_steps": 0, "target_return": None,
                     "checkpoint_every_steps": 256},
             "env": {"num_envs": 8}, "num_steps": 32, "minibatch_size": 64,
             "model": {"hidden": [8]},
             "optim": {"anneal_steps": 4096, "lr_schedule": "linear"}}  # fmt: skip

    def spec(steps):
        config = {**small, "run": {**small["run"], "total_steps": steps}}
        return {"name": "sittings", "base": "ppo-cartpole", "config": config}

    sitting = tmp_path / "first"
    [name] = [r.name for r in plan(spec(1024), sitting).runs]
    run_experiment(plan(spec(512), sitting), jobs=1)  # half of the run's 1,024 steps ...
    status_file = sitting / "status.json"
    status = json.loads(status_file.read_text())
    status[name] = {**status[name], "state": "interrupted", "wall_before_s": 1.0}
    status_file.write_text(json.dumps(status))  # ... and stopped there, as a SIGTERM leaves it
    archived = tmp_path / "archive"
    assert archiver.archive(sitting, archived, window=1, unfinished=True) == [name]

    shutil.rmtree(sitting)  # the next sitting's checkout: the archive alone, copied back
    restored = sitting
    shutil.copytree(archived, restored)
    status = run_experiment(plan(spec(1024), restored), jobs=1)
    assert status[name]["state"] == "done" and status[name]["steps"] == 1024
    assert "resumed from step 512" in (restored / "configs" / f"{name}.log").read_text()
    run_experiment(plan(spec(1024), tmp_path / "straight"), jobs=1)

    def losses(run_dir):
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        return [(r["step"], r["loss/total"]) for r in rows if "loss/total" in r]

    assert losses(restored / name) == losses(tmp_path / "straight" / name)
