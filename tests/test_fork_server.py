"""`shoal.studies.fork_server`: ``shoal`` commands forked from a process that imported torch
once, as `shoal.experiment` starts its runs. A forked run is the run ``python -m shoal.cli``
gives (same metrics, same exit statuses), in the caller's environment and working directory,
and the caller's script is not run again (multiprocessing's forkserver and spawn would)."""

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from shoal.studies.fork_server import start_command

RUN = ["train", "ppo", "--env", "CartPole-v1", "--total-steps", "256", "--env.num-envs", "4",
       "--num-steps", "32", "--minibatch-size", "64", "--model.hidden", "8", "--run.seed", "5",
       "--run.eval-every-steps", "0", "--run.no-console", "--run.no-tensorboard",
       "--run.torch-threads", "1"]  # fmt: skip


def rows(run_dir):
    """The metrics rows without their wall-clock columns."""
    timed = ("time", "perf/", "fps", "sps", "wall")
    return [
        {k: v for k, v in json.loads(line).items() if not any(t in k for t in timed)}
        for line in (run_dir / "metrics.jsonl").read_text().splitlines()
    ]


def test_a_forked_run_is_the_run_of_python_m_shoal_cli(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SHOAL_FORK_TEST", "caller")
    forked = start_command([*RUN, "--run-dir", "forked"], tmp_path / "forked.log")
    assert forked.wait(timeout=300) == 0, (tmp_path / "forked.log").read_text()
    assert forked.returncode == 0 and forked.poll() == 0
    fresh = subprocess.run([sys.executable, "-m", "shoal.cli", *RUN, "--run-dir", "fresh"],
                           capture_output=True, text=True, timeout=300)  # fmt: skip
    assert fresh.returncode == 0, fresh.stderr
    assert rows(tmp_path / "forked") == rows(tmp_path / "fresh")  # (relative to the cwd)
    # The same summary (its times apart), with no terminal codes in the log.
    said = [line for line in (tmp_path / "forked.log").read_text().splitlines()
            if not line.startswith("time:")]  # fmt: skip
    fresh_said = [line.replace("fresh", "forked") for line in fresh.stdout.splitlines()
                  if not line.startswith("time:")]  # fmt: skip
    assert said == fresh_said and "\x1b[" not in "".join(said)
    # Bad input: exit status 2 and the one-line error in the log, as from the command.
    bad = start_command(["train", "ppo", "--env", "CartPol-v1"], tmp_path / "bad.log")
    assert bad.wait(timeout=120) == 2
    log = (tmp_path / "bad.log").read_text()
    assert "error:" in log and "CartPol-v1" in log and "Traceback" not in log


def test_the_callers_environment_and_path_reach_the_run(tmp_path, monkeypatch):
    """A callback module found through the caller's PYTHONPATH (set after the server
    started), a variable of the caller's environment and its working directory (where the
    run's relative paths and its log's are) reach the forked run."""
    first = start_command(["list"], tmp_path / "list.log")  # the server is up
    assert first.wait(timeout=120) == 0
    module = tmp_path / "mods"
    module.mkdir()
    (module / "fork_probe.py").write_text(textwrap.dedent("""
        import os
        from pathlib import Path

        class Probe:
            def on_iteration(self, metrics):
                Path(os.environ["PROBE_OUT"]).write_text(os.getcwd())
    """))  # fmt: skip
    monkeypatch.setenv("PYTHONPATH", str(module))
    monkeypatch.setenv("PROBE_OUT", str(tmp_path / "probe.txt"))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    run = start_command([*RUN, "--run-dir", "r", "--run.callbacks", "fork_probe:Probe()"],
                        Path("probe.log"))  # fmt: skip
    assert run.wait(timeout=300) == 0, (work / "probe.log").read_text()
    assert (tmp_path / "probe.txt").read_text() == str(work)
    assert (work / "r" / "metrics.jsonl").exists()  # relative paths are the caller's


def test_sigterm_saves_and_ends_the_run_as_it_ends_a_process(tmp_path):
    run_dir = tmp_path / "long"
    long = [*RUN, "--total-steps", "10000000", "--run-dir", str(run_dir)]
    run = start_command(long, tmp_path / "long.log")
    metrics = run_dir / "metrics.jsonl"
    deadline = time.time() + 120
    # A logged row: the run is in its loop, its stop handlers in place.
    while not (metrics.exists() and metrics.stat().st_size) and time.time() < deadline:
        time.sleep(0.2)
    assert run.poll() is None
    run.terminate()
    assert run.wait(timeout=120) == -signal.SIGTERM
    log = (tmp_path / "long.log").read_text()
    saved = re.search(r"SIGTERM: the run is saved in (\S+); terminating", log)
    assert saved, log
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == Path(saved[1]).name


def test_a_script_that_runs_an_experiment_is_not_run_again(tmp_path):
    """No ``if __name__ == "__main__"`` guard: the script runs once, its run once."""
    script = tmp_path / "sweep.py"
    script.write_text(textwrap.dedent(f"""
        from pathlib import Path
        import shoal
        with open({str(tmp_path / "ran.txt")!r}, "a") as f:
            f.write("ran\\n")
        shoal.experiment({{"name": "once", "base": "ppo-cartpole", "config": {{
            "run": {{"total_steps": 128, "eval_every_steps": 0, "target_return": None}},
            "env": {{"num_envs": 4}}, "num_steps": 32, "minibatch_size": 64,
            "model": {{"hidden": [8]}}}}}},
            directory={str(tmp_path / "exp")!r}, jobs=1)
    """))  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300, env=env, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert (tmp_path / "ran.txt").read_text() == "ran\n"
    status = json.loads((tmp_path / "exp" / "status.json").read_text())
    assert [entry["state"] for entry in status.values()] == ["done"]
