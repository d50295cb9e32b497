"""Checkpoints survive their faults: a save killed at random points, or before any of its disk
steps, always leaves a loadable checkpoint; an unreadable newest checkpoint gives way to the
newest good one, with a note (and a resume sets it aside); a full disk while saving is one
clear error that keeps the previous checkpoint and the metrics."""

import errno
import json
import signal
import time

import checkpoint_savers
import numpy as np
import pytest
import torch

import shoal
from shoal.core.errors import CheckpointError, ShoalError
from shoal.train.checkpoint import load_checkpoint, save_checkpoint

PROCESSES = checkpoint_savers.processes()
"""The savers' processes: forks of a server that imported them once."""

SMALL = {"env.num_envs": 4, "num_steps": 16, "minibatch_size": 32, "num_epochs": 1,
         "run.eval_every_steps": 0, "run.console": False, "run.tensorboard": False,
         "run.checkpoint_every_steps": 64, "run.keep_checkpoints": 3}  # fmt: skip


def test_a_save_killed_at_random_points_leaves_a_loadable_checkpoint(tmp_path):
    """SIGKILL a process that saves checkpoints back to back, at 12 random moments (each
    restart goes on from where the last one left the directory): after every kill the run
    loads, and its state is one whole save."""
    rng = np.random.default_rng(0)
    run = tmp_path / "run"
    loaded_steps, mid_write = [], 0
    for _ in range(12):
        latest = run / "checkpoints" / "latest"
        before = latest.read_text() if latest.exists() else None
        saver = PROCESSES.Process(target=checkpoint_savers.save_back_to_back, args=(str(run),))
        saver.start()
        deadline = time.time() + 60
        while (not latest.exists() or latest.read_text() == before) and time.time() < deadline:
            time.sleep(0.005)  # until this process has saved once
        time.sleep(float(rng.uniform(0.0, 0.3)))  # somewhere inside a save, most often
        saver.kill()
        saver.join()
        mid_write += bool(list((run / "checkpoints").glob(".tmp-*")))  # cut inside a save
        checkpoint = load_checkpoint(run)
        step = checkpoint.state["step"]
        assert checkpoint.config == {"step": step} and checkpoint.meta["env_steps"] == step
        np.testing.assert_array_equal(checkpoint.state["big"][:3],
                                      np.random.default_rng(0).normal(size=3) + step)  # fmt: skip
        loaded_steps.append(step)
    assert len(loaded_steps) == 12
    assert mid_write >= 1, mid_write  # some landed inside saves (the next test hits each step)


def test_a_save_killed_before_each_of_its_disk_steps_leaves_a_loadable_checkpoint(tmp_path):
    """The same, deterministically: the third save is killed before its first, second, ...
    fsync, rename or removal, until it runs through; each time the run loads a whole save
    (the third once its rename landed), and the next save cleans up after the killed one."""
    at, outcomes = 0, []
    while True:
        at += 1
        run = tmp_path / f"run{at}"
        saver = PROCESSES.Process(target=checkpoint_savers.save_three_killed_at,
                                  args=(str(run), at))  # fmt: skip
        saver.start()
        saver.join(timeout=120)
        checkpoint = load_checkpoint(run)
        step = checkpoint.state["step"]
        assert step in (2, 3) and checkpoint.config == {"step": step}
        assert checkpoint.meta["env_steps"] == step
        np.testing.assert_array_equal(checkpoint.state["big"][:3],
                                      np.random.default_rng(0).normal(size=3) + step)  # fmt: skip
        save_checkpoint(run, 4, "ppo", {"step": 4}, {"step": 4}, keep=2)
        assert not list((run / "checkpoints").glob(".tmp-*"))
        assert load_checkpoint(run).state["step"] == 4
        outcomes.append(step)
        if saver.exitcode == 0:
            break
        assert saver.exitcode == -signal.SIGKILL, saver.exitcode
    assert at >= 8  # fsyncs of three files and two directories, the rename, latest, pruning
    assert outcomes[0] == 2 and outcomes[-1] == 3  # killed early: the old one; late: the new


@pytest.mark.parametrize("damage", ["truncated", "emptied", "no state.pt"])
def test_an_unreadable_newest_checkpoint_gives_way_to_the_one_before(damage, tmp_path, capsys):
    result = shoal.train("ppo", env="CartPole-v1", total_steps=192, run_dir=str(tmp_path / "r"),
                         **SMALL)  # fmt: skip
    root = tmp_path / "r" / "checkpoints"
    newest, before = sorted(root.glob("step_*"))[-1], sorted(root.glob("step_*"))[-2]
    state = newest / "state.pt"
    if damage == "truncated":
        state.write_bytes(state.read_bytes()[: state.stat().st_size // 3])
    elif damage == "emptied":
        state.write_bytes(b"")
    else:
        state.unlink()
    capsys.readouterr()
    assert shoal.load(result.run_dir) is not None  # eval, export and load read the one before
    out = capsys.readouterr().out
    assert f"note: checkpoint {newest} is " in out and f"using {before.name}" in out
    assert len(out.strip().splitlines()) == 1
    # A resume goes on from the good one and sets the unreadable one aside, so that new
    # checkpoints neither sort below it nor get pruned for it.
    resumed = shoal.train(resume=result.run_dir, total_steps=256, quiet=True)
    assert resumed.resumed_from == int(before.name.removeprefix("step_"))
    names = sorted(p.name for p in root.iterdir())
    assert f".unreadable-{newest.name}" in names and "step_000000000256" in names
    assert load_checkpoint(result.run_dir).meta["env_steps"] == 256


def test_no_readable_checkpoint_is_refused_by_name(tmp_path):
    for step in (1, 2):
        path = save_checkpoint(tmp_path, step, "ppo", {}, {"step": step})
        (path / "state.pt").write_bytes(b"")
    with pytest.raises(
        CheckpointError, match="holds no readable checkpoint: checkpoint .*step_000000000002"
    ):
        load_checkpoint(tmp_path)


def test_a_full_disk_while_saving_is_one_clear_error(tmp_path, monkeypatch):
    """The save at 128 steps finds the disk full: one error naming it; the checkpoint at 64
    steps loads, and the metrics logged up to the failure are on disk."""
    real_save = torch.save

    def save(obj, target, *args, **kwargs):
        if save.calls == 1:  # the second save, at 128 steps
            raise OSError(errno.ENOSPC, "No space left on device")
        save.calls += 1
        return real_save(obj, target, *args, **kwargs)

    save.calls = 0
    monkeypatch.setattr(torch, "save", save)
    with pytest.raises(ShoalError, match="No space left on device"):
        shoal.train("ppo", env="CartPole-v1", total_steps=256, run_dir=str(tmp_path / "r"),
                    **SMALL)  # fmt: skip
    monkeypatch.undo()
    root = tmp_path / "r" / "checkpoints"
    assert [p.name for p in root.glob("step_*")] == ["step_000000000064"]
    assert not list(root.glob(".tmp-*"))
    assert load_checkpoint(tmp_path / "r").meta["env_steps"] == 64
    rows = [
        json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [row["step"] for row in rows] == [64, 128]


def test_pruning_never_deletes_the_checkpoint_just_written(tmp_path):
    """A run resumed from an older checkpoint saves below a newer one still there: the new
    save survives the pruning, and ``latest`` names it."""
    for step in (100, 200, 300):
        save_checkpoint(tmp_path, step, "ppo", {}, {"step": step}, keep=2)
    save_checkpoint(tmp_path, 150, "ppo", {}, {"step": 150}, keep=2)
    names = sorted(p.name for p in (tmp_path / "checkpoints").glob("step_*"))
    assert names == ["step_000000000150", "step_000000000300"]
    assert load_checkpoint(tmp_path).state == {"step": 150}
