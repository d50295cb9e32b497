"""``shoal experiment``: grid expansion and seeding, bad files refused before any run, runs
in parallel processes, a failing run recorded while the others finish, resume after the
whole experiment was killed mid-way, SIGTERM passed on to the runs, and a directory of
another experiment refused."""

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

import shoal
from shoal.core.errors import ConfigError, ShoalError
from shoal.studies.experiment import run_experiment
from shoal.studies.plan import plan

# No evaluations (ppo-cartpole's target_return would evaluate every iteration to watch for it).
SMALL = {"run": {"total_steps": 1024, "eval_every_steps": 0, "target_return": None,
                 "checkpoint_every_steps": 256},
         "env": {"num_envs": 8}, "num_steps": 32, "minibatch_size": 64,
         "model": {"hidden": [8]}}  # fmt: skip


def spec(**extra):
    return {"name": "grid", "base": "ppo-cartpole", "config": SMALL, **extra}


def test_grid_times_seeds_with_distinct_reproducible_seeds(tmp_path):
    axes = {"optim.lr": [1e-3, 3e-4], "num_epochs": [2, 4, 8]}
    experiment = plan(spec(axes=axes, seeds=3), tmp_path / "grid")
    assert len(experiment.runs) == 2 * 3 * 3
    assert len({r.seed for r in experiment.runs}) == 18  # every run its own seed
    assert [r.seed for r in plan(spec(axes=axes, seeds=3), tmp_path / "x").runs] == [
        r.seed for r in experiment.runs
    ]  # the same file gives the same runs
    first = experiment.runs[0]
    assert first.name == "optim.lr=0.001,num_epochs=2-s0"
    assert first.config["optim"]["lr"] == 1e-3 and first.config["num_epochs"] == 2
    assert first.config["run"]["seed"] == first.seed
    assert first.config["run"]["run_dir"] == str(tmp_path / "grid" / first.name)
    # Varying the algorithm: each variant is that algorithm's config.
    both = plan({"name": "algos", "config": {"env": {"id": "CartPole-v1"}},
                 "axes": {"algo": ["ppo", "a2c"]}}, tmp_path / "algos")  # fmt: skip
    assert [r.algo for r in both.runs] == ["ppo", "a2c"]


def test_bad_files_are_refused_before_any_run(tmp_path):
    with pytest.raises(ConfigError, match="did you mean lr"):
        plan(spec(axes={"optim.lrr": [1e-3]}), tmp_path / "a")
    with pytest.raises(ConfigError, match="must be a number"):
        plan(spec(axes={"optim.lr": ["fast"]}), tmp_path / "b")
    with pytest.raises(ConfigError, match="non-empty list"):
        plan(spec(axes={"optim.lr": []}), tmp_path / "c")
    with pytest.raises(ConfigError, match="unknown keys"):
        plan(spec(axis={"optim.lr": [1e-3]}), tmp_path / "d")
    # A typo that would plan (and build the configs of) a million runs fails at once.
    with pytest.raises(ConfigError, match="is seeds = 1000000 meant"):
        plan(spec(seeds=1_000_000), tmp_path / "e")
    with pytest.raises(ConfigError, match="10,000 at most"):
        plan(spec(axes={"optim.lr": [1e-3, 2e-3]}, seeds=5_001), tmp_path / "f")
    assert not (tmp_path / "a").exists()


def test_a_plan_from_an_older_shoal_resumes_unless_a_value_changed(tmp_path):
    """A directory planned by a shoal without a config field this one has (its saved
    configs lack the field, so the fingerprint differs) is the same plan when the field's
    default is what the old shoal did; a run whose saved value differs is another plan."""
    from shoal.studies.experiment import prepare

    experiment = plan(spec(axes={"optim.lr": [1e-3, 2e-3]}), tmp_path / "exp")
    prepare(experiment)
    held = experiment.directory / "experiment.json"
    old = json.loads(held.read_text())
    old["fingerprint"] = "0123456789abcdef"  # what the older shoal hashed
    held.write_text(json.dumps(old))
    saved = experiment.directory / "configs" / f"{experiment.runs[0].name}.yaml"
    config = yaml.safe_load(saved.read_text())
    del config["config"]["target_kl"]  # a field the older shoal lacked (default None)
    saved.write_text(yaml.safe_dump(config))
    status = prepare(experiment)
    assert set(status) == {r.name for r in experiment.runs}
    assert json.loads(held.read_text())["fingerprint"] == experiment.fingerprint
    assert "target_kl" in yaml.safe_load(saved.read_text())["config"]  # rewritten

    held.write_text(json.dumps(old))
    config["config"]["optim"]["lr"] = 5e-3
    saved.write_text(yaml.safe_dump(config))
    (experiment.directory / experiment.runs[0].name).mkdir()  # the run has started
    with pytest.raises(ShoalError, match="holds the runs of another experiment"):
        prepare(experiment)


def test_an_interrupted_run_whose_directory_is_gone_starts_afresh(tmp_path):
    """A run stopped mid-way resumes with its wall-clock so far; the same entry without its
    directory (an archive restored, which keeps finished runs only, or the directory
    removed) starts from nothing, so it carries no wall-clock or attempts of a lost start."""
    from shoal.studies.experiment import prepare

    experiment = plan(spec(seeds=2), tmp_path / "exp")
    prepare(experiment)
    kept, gone = (r.name for r in experiment.runs)
    stopped = {"state": "interrupted", "attempts": 1, "steps": 512, "wall_s": 100.0,
               "wall_before_s": 100.0}  # fmt: skip
    status_file = experiment.directory / "status.json"
    status_file.write_text(json.dumps({kept: stopped, gone: {**stopped, "state": "running"}}))
    (experiment.directory / kept).mkdir()
    status = prepare(experiment)
    assert status[kept] == {**stopped, "state": "pending"}
    assert status[gone] == {"state": "pending"}


def test_a_start_killed_without_recording_its_end_keeps_its_wall_clock(tmp_path):
    """A start killed hard (the machine went down) leaves its run "running" with the
    wall-clock it last recorded and none saved as before; the next start adds to that
    wall-clock, not to the one before the lost start."""
    from shoal.studies.experiment import prepare

    experiment = plan(spec(seeds=1), tmp_path / "exp")
    prepare(experiment)
    (name,) = (r.name for r in experiment.runs)
    (experiment.directory / name).mkdir()
    killed = {"state": "running", "attempts": 0, "steps": 900, "wall_s": 300.0}
    (experiment.directory / "status.json").write_text(json.dumps({name: killed}))
    status = prepare(experiment)
    assert status[name] == {**killed, "state": "pending", "wall_before_s": 300.0}


def test_runs_without_results_can_be_changed_added_or_dropped_and_the_others_cannot(tmp_path):
    """Change the settings of a run that ``--runs`` left waiting: the next start runs it
    with them (nothing of it is lost). Add a variant beside finished runs: it runs alone.
    Changing or dropping a run that has run is refused (its results would no longer match
    the file)."""
    file = tmp_path / "two.yaml"
    small = {**SMALL, "run": {**SMALL["run"], "total_steps": 256}}

    def write(**rates):
        variants = {name: {"config": {"optim": {"lr": lr}}} for name, lr in rates.items()}
        spec = {"name": "two", "base": "ppo-cartpole", "config": small, "variants": variants}
        file.write_text(json.dumps(spec))

    write(a=1e-3, b=1e-3, waiting=1e-3)
    directory = tmp_path / "exp"
    status = shoal.experiment(file, directory, jobs=1, only=["a-*"])
    assert status["a-s0"]["state"] == "done" and status["b-s0"]["state"] == "pending"
    write(a=1e-3, b=2e-3)  # b changed and "waiting" dropped before either started
    status = shoal.experiment(file, directory, jobs=1)
    assert set(status) == {"a-s0", "b-s0"} and status["b-s0"]["state"] == "done"
    assert json.loads((directory / "b-s0" / "config.json").read_text())["optim"]["lr"] == 2e-3
    assert not (directory / "configs" / "waiting-s0.yaml").exists()
    finished = {name: (directory / name / "metrics.jsonl").stat().st_mtime for name in status}
    write(a=1e-3, b=2e-3, c=3e-3)  # one more variant
    status = shoal.experiment(file, directory, jobs=1)
    assert {entry["state"] for entry in status.values()} == {"done"} and "c-s0" in status
    for name, mtime in finished.items():
        assert (directory / name / "metrics.jsonl").stat().st_mtime == mtime  # not run again
    for changed in ({"a": 3e-3, "b": 2e-3, "c": 3e-3}, {"b": 2e-3, "c": 3e-3}):
        write(**changed)  # a run with results changed, then dropped
        with pytest.raises(ShoalError, match="holds the runs of another experiment"):
            shoal.experiment(file, directory, jobs=1)


def losses(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss/total"]) for r in rows if "loss/total" in r]


def test_a_raised_budget_extends_finished_runs_as_if_planned_so(tmp_path):
    """Raising ``run.total_steps`` in the file takes the finished runs on from their last
    checkpoint to the new budget, and they end as runs planned with it from the start would.
    A lowered budget, or a raised one for runs that anneal over their budget, is refused."""
    pinned = {**SMALL, "optim": {"anneal_steps": 4096, "lr_schedule": "linear"}}

    def budget(steps):
        return {**spec(), "config": {**pinned, "run": {**SMALL["run"], "total_steps": steps}}}

    short = plan(budget(512), tmp_path / "exp")
    [name] = [r.name for r in short.runs]
    assert run_experiment(short, jobs=1)[name]["steps"] == 512
    first = losses(tmp_path / "exp" / name)
    status = run_experiment(plan(budget(1024), tmp_path / "exp"), jobs=1)
    assert status[name]["state"] == "done" and status[name]["steps"] == 1024
    extended = losses(tmp_path / "exp" / name)
    assert extended[: len(first)] == first and len(extended) == 2 * len(first)
    run_experiment(plan(budget(1024), tmp_path / "straight"), jobs=1)
    assert losses(tmp_path / "straight" / name) == extended
    with pytest.raises(ShoalError, match="budget is 1,024 steps and this file gives 512"):
        run_experiment(plan(budget(512), tmp_path / "exp"))
    loose = {**spec(), "config": {**SMALL, "run": {**SMALL["run"], "total_steps": 256}}}
    run_experiment(plan(loose, tmp_path / "loose"), jobs=1)
    loose["config"]["run"]["total_steps"] = 512
    with pytest.raises(ShoalError, match=r"anneals over its budget \(optim.anneal_steps unset\)"):
        run_experiment(plan(loose, tmp_path / "loose"))


def test_runs_in_parallel_and_records_a_failure(tmp_path):
    bad = spec(axes={"env.id": ["CartPole-v1", "NoSuchEnv-v0"]})
    experiment = plan(bad, tmp_path / "exp")
    status = run_experiment(experiment, jobs=2)
    good, failed = (status[r.name] for r in experiment.runs)
    assert good["state"] == "done" and good["steps"] == 1024
    assert failed["state"] == "failed" and "NoSuchEnv" in failed["error"]
    assert (tmp_path / "exp" / experiment.runs[0].name / "checkpoints" / "latest").exists()
    saved = json.loads((tmp_path / "exp" / "status.json").read_text())
    assert saved[experiment.runs[1].name]["state"] == "failed"
    # Run again: nothing left to run, and the table shows the finished runs at once.
    seen = []
    run_experiment(experiment, jobs=2, on_update=lambda s: seen.append(json.loads(json.dumps(s))))
    assert seen and seen[0][experiment.runs[0].name]["state"] == "done"
    assert seen[0][experiment.runs[0].name]["steps"] == 1024
    other = plan({**spec(axes={"optim.lr": [1e-2]}), "name": "other"}, tmp_path / "exp")
    with pytest.raises(ShoalError, match="holds the runs of another experiment"):
        run_experiment(other)


def start_experiment_process(tmp_path, name, total_steps, seeds):
    """A `shoal.experiment` of `ppo-cartpole` runs in a process (and session) of its own;
    returns the process, the experiment file and its directory."""
    settings = {**SMALL, "run": {**SMALL["run"], "total_steps": total_steps}}
    file = tmp_path / "exp.yaml"
    file.write_text(json.dumps({"name": name, "base": "ppo-cartpole", "config": settings,
                                "seeds": seeds}))  # fmt: skip
    directory = tmp_path / "exp"
    code = "import shoal, sys; shoal.experiment(sys.argv[1], sys.argv[2], jobs=1)"
    parent = subprocess.Popen([sys.executable, "-c", code, str(file), str(directory)],
                              start_new_session=True)  # fmt: skip
    return parent, file, directory


def wait_for(path, seconds):
    deadline = time.time() + seconds
    while not path.exists() and time.time() < deadline:
        time.sleep(0.2)


def test_resumes_after_the_whole_experiment_was_killed(tmp_path):
    """Kill the experiment and its runs mid-way; starting it again keeps the finished run
    and resumes the one that was cut off from its checkpoint, to the same final weights as a
    run that was never stopped."""
    parent, file, directory = start_experiment_process(tmp_path, "kill", 8192, seeds=2)
    wait_for(directory / "base-s1" / "checkpoints" / "latest", 240)  # run 2 has saved one
    os.killpg(parent.pid, signal.SIGKILL)
    parent.wait()
    status = json.loads((directory / "status.json").read_text())
    assert status["base-s0"]["state"] == "done" and status["base-s1"]["state"] == "running"
    done_at = (directory / "base-s0" / "metrics.jsonl").stat().st_mtime
    status = shoal.experiment(file, directory, jobs=1)
    assert all(entry["state"] == "done" for entry in status.values())
    assert (directory / "base-s0" / "metrics.jsonl").stat().st_mtime == done_at  # kept
    log = (directory / "configs" / "base-s1.log").read_text()
    assert "resum" in log.lower()  # the cut-off run resumed from its checkpoint
    straight = shoal.train(tuned=str(directory / "configs" / "base-s1.yaml"),
                           run_dir=str(tmp_path / "straight"))  # fmt: skip
    resumed = shoal.load(directory / "base-s1").model.state_dict()
    for name, value in shoal.load(straight.run_dir).model.state_dict().items():
        assert torch.equal(value, resumed[name]), name


def test_sigterm_to_the_experiment_reaches_its_runs_which_save(tmp_path):
    """SIGTERM to the experiment alone (a batch scheduler's notice, `kill PID`) is passed on
    to its running run, which saves a checkpoint and exits; the run is recorded as
    interrupted, to be resumed, not left running without its experiment, with the wall-clock
    it ran."""
    parent, _, directory = start_experiment_process(tmp_path, "term", 10**8, seeds=1)
    latest = directory / "base-s0" / "checkpoints" / "latest"
    wait_for(latest, 120)  # the run is training
    parent.send_signal(signal.SIGTERM)  # to the experiment's process alone
    try:
        assert parent.wait(timeout=120) != 0
    finally:
        with contextlib.suppress(ProcessLookupError):  # what is left, should the test fail
            os.killpg(parent.pid, signal.SIGKILL)
    status = json.loads((directory / "status.json").read_text())
    assert status["base-s0"]["state"] == "interrupted"
    # its wall-clock so far is kept for the start that resumes it to add to
    assert status["base-s0"]["wall_before_s"] == status["base-s0"]["wall_s"] > 0
    log = (directory / "configs" / "base-s0.log").read_text()
    saved = re.search(r"SIGTERM: the run is saved in (\S+); terminating", log)
    assert saved, log
    assert latest.read_text().strip() == Path(saved[1]).name  # saved where it stopped


def test_command_line_plan(tmp_path, capsys):
    from shoal.cli import main

    file = tmp_path / "sweep.yaml"
    file.write_text(json.dumps({**spec(axes={"optim.lr": [1e-3, 3e-4]}), "seeds": 2}))
    assert main(["experiment", str(file), "--dir", str(tmp_path / "d"), "--plan"]) == 0
    out = capsys.readouterr().out
    assert "4 runs" in out and "optim.lr=0.0003-s1" in out
    assert not (tmp_path / "d").exists()  # --plan runs nothing


def test_a_run_gets_this_starts_share_of_the_cores_when_it_resumes(tmp_path):
    """A run started under ``--jobs 1`` (all the cores) and resumed under ``--jobs 2`` gets
    the new share on resume too: two resumed runs must not both ask for every core."""
    from shoal.studies.experiment import command

    experiment = plan(spec(seeds=1), tmp_path / "exp")
    [run] = experiment.runs
    fresh = command(experiment, run, threads=2)
    assert fresh[-2:] == ["--run.torch-threads", "2"] and "--config" in fresh
    (tmp_path / "exp" / run.name / "checkpoints" / "latest").mkdir(parents=True)
    resumed = command(experiment, run, threads=1)
    assert "--resume" in resumed and resumed[-2:] == ["--run.torch-threads", "1"]


def test_runs_picked_by_name_run_alone_and_the_rest_wait(tmp_path, capsys):
    """``--runs GLOB`` (``only=``): the matching runs run, the others stay pending until a
    start without it (which runs just those); a glob that matches no run is refused with the
    runs' names, before anything runs."""
    from shoal.cli import main

    grid = {**spec(axes={"optim.lr": [1e-3, 3e-4]}),
            "config": {**SMALL, "run": {**SMALL["run"], "total_steps": 256}}}  # fmt: skip
    file = tmp_path / "sweep.yaml"
    file.write_text(json.dumps(grid))
    directory = tmp_path / "d"
    args = ["experiment", str(file), "--dir", str(directory), "--jobs", "1"]
    assert main([*args, "--plan", "--runs", "*0.001*"]) == 0
    assert "optim.lr=0.001-s0" in (out := capsys.readouterr().out) and "0.0003-s0  (" not in out
    assert main([*args, "--runs", "*0.001*"]) == 0
    status = json.loads((directory / "status.json").read_text())
    assert status["optim.lr=0.001-s0"]["state"] == "done"
    assert status["optim.lr=0.0003-s0"]["state"] == "pending"
    assert not (directory / "optim.lr=0.0003-s0").exists()
    status = run_experiment(plan(grid, directory), jobs=1)
    assert {entry["state"] for entry in status.values()} == {"done"}
    assert status["optim.lr=0.001-s0"]["attempts"] == 1  # not run a second time
    assert main([*args, "--runs", "ppo-*"]) == 2
    refused = capsys.readouterr().out
    assert "no run of grid matches 'ppo-*'; its runs are optim.lr=0.001-s0" in refused


def test_the_references_experiment_files_plan(tmp_path):
    """Every file in experiments/ names fields and tuned examples that exist."""
    from pathlib import Path

    from shoal.studies.plan import read_spec

    files = sorted((Path(__file__).parent.parent / "experiments").glob("*.yaml"))
    assert len(files) >= 4
    for file in files:
        spec = read_spec(file)
        experiment = plan(spec, tmp_path / file.stem)
        own_seeds = [
            r.seed
            for r in experiment.runs
            if "seeds_of" not in (spec.get("variants") or {}).get(r.variant, {})
        ]
        assert experiment.runs and len(set(own_seeds)) == len(own_seeds)


def test_variants_merge_their_own_config_over_the_files(tmp_path):
    spec = {"name": "v", "config": {"env": {"id": "CartPole-v1", "num_envs": 4}},
            "variants": {"ppo-small": {"algo": "ppo", "config": {"model": {"hidden": [8]}}},
                         "a2c": {"algo": "a2c"}},
            "axes": {"run.seed": [0]}}  # fmt: skip
    runs = plan(spec, tmp_path / "v").runs
    assert [r.algo for r in runs] == ["ppo", "a2c"]
    assert runs[0].config["model"]["hidden"] == [8] and runs[0].config["env"]["num_envs"] == 4
    assert runs[1].config["env"]["num_envs"] == 4
    with pytest.raises(ConfigError, match="unknown keys"):
        plan({**spec, "variants": {"x": {"algo": "ppo", "optim": {}}}}, tmp_path / "w")


def test_a_variant_takes_another_variants_seeds_when_it_says_so(tmp_path):
    """``seeds_of``: run k of both variants trains with one seed (a one-change comparison);
    across the axes too, point by point; a name that is not a variant, or a circle, is refused."""
    spec = {"name": "paired", "algo": "ppo", "config": {"env": {"id": "CartPole-v1"}},
            "variants": {"a": {}, "b": {"config": {"optim": {"lr": 0.001}}, "seeds_of": "a"},
                         "c": {"seeds_of": "b"}, "d": {}},
            "axes": {"num_epochs": [2, 4]}, "seeds": 2}  # fmt: skip
    seeds = {r.name: r.seed for r in plan(spec, tmp_path / "p").runs}
    for k in (0, 1):
        for epochs in (2, 4):
            a = seeds[f"a,num_epochs={epochs}-s{k}"]
            assert seeds[f"b,num_epochs={epochs}-s{k}"] == seeds[f"c,num_epochs={epochs}-s{k}"] == a
            assert seeds[f"d,num_epochs={epochs}-s{k}"] != a
    assert len({seeds[f"a,num_epochs={e}-s{k}"] for e in (2, 4) for k in (0, 1)}) == 4
    run = next(r for r in plan(spec, tmp_path / "p").runs if r.variant.startswith("b,"))
    assert "seeds_of" not in run.config and run.config["run"]["seed"] == run.seed
    bad = {**spec, "variants": {"a": {"seeds_of": "z"}}}
    with pytest.raises(ConfigError, match="seeds_of 'z' is not a variant"):
        plan(bad, tmp_path / "q")
    circle = {**spec, "variants": {"a": {"seeds_of": "b"}, "b": {"seeds_of": "a"}}}
    with pytest.raises(ConfigError, match="circle"):
        plan(circle, tmp_path / "r")


def test_runs_as_ray_tasks(ray_session, tmp_path):
    """The same experiment with each run a Ray task (here the local Ray of the tests; on a
    cluster, any node): runs finish, a failing one is recorded."""
    experiment = plan(spec(axes={"env.id": ["CartPole-v1", "NoSuchEnv-v0"]}), tmp_path / "ray")
    status = run_experiment(experiment, jobs=2, ray_address="local")
    good, failed = (status[r.name] for r in experiment.runs)
    assert good["state"] == "done" and good["steps"] == 1024
    assert failed["state"] == "failed" and "NoSuchEnv" in failed["error"]


CRASH_ONCE = '''
import os
from pathlib import Path


class CrashOnce:
    """Crash the run process (as a kill would) at its first iteration, the first time."""

    def __init__(self, marker):
        self.marker = Path(marker)

    def on_iteration(self, metrics):
        if not self.marker.exists():
            self.marker.write_text("crashed")
            os._exit(1)
'''


def test_a_crashed_run_is_retried_and_a_refused_one_is_not(tmp_path, monkeypatch):
    """A run that crashes once finishes on its retry; one refused for bad input (exit 2)
    is recorded as failed at once, with its error."""
    (tmp_path / "crash_once.py").write_text(CRASH_ONCE)
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    )
    marker = tmp_path / "crashed"
    callback = f"crash_once:CrashOnce(marker={str(marker)!r})"
    crashing = {**SMALL, "run": {**SMALL["run"], "callbacks": [callback]}}
    spec = {"name": "retry", "base": "ppo-cartpole", "config": crashing,
            "axes": {"env.id": ["CartPole-v1", "NoSuchEnv-v0"]}}  # fmt: skip
    experiment = plan(spec, tmp_path / "exp")
    status = run_experiment(experiment, jobs=1, retries=2)
    good, bad = (status[r.name] for r in experiment.runs)
    assert marker.read_text() == "crashed"
    assert good["state"] == "done" and good["attempts"] == 2 and good["steps"] == 1024
    assert bad["state"] == "failed" and bad["attempts"] == 1 and "NoSuchEnv" in bad["error"]
