"""What a new user meets in the first hour, checked the way they meet it: the `shoal` command as a
process of its own (exit code, no traceback, what the message names), and the README's
commands.

Where the command's own start is what is checked (the console script, what it imports from
the working directory or ``PYTHONPATH``) the command is a fresh subprocess. Elsewhere it is
forked from a process that imported torch once, as `shoal experiment` starts its runs
(`shoal.studies.fork_server`, whose tests show a forked command gives the fresh one's output
and exit status): 3 to 4 s less per command."""

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np
import pytest

import shoal
from shoal.core.errors import ShoalError
from shoal.studies.fork_server import start_command
from shoal.train.run_dir import default_run_dir

REPO = Path(__file__).resolve().parents[1]
SHOAL = Path(sys.executable).with_name("shoal")  # the console script, as users run it
SMALL = [
    "--env.num-envs", "4", "--num-steps", "16", "--minibatch-size", "32", "--num-epochs", "1",
    "--model.hidden", "16", "--run.no-console", "--run.no-tensorboard",
]  # fmt: skip


def shoal_cli(*args, cwd=None, timeout=180, env=None, fresh=False):
    """``shoal ARGS`` as a user types it; returns (exit code, stdout and stderr together).
    ``fresh``: the console script in a new process, not a fork."""
    environ = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "80", **(env or {})}
    environ.pop("PYTHONPATH", None)
    if not fresh:
        with tempfile.TemporaryDirectory() as directory:
            log = Path(directory) / "out.log"
            command = start_command([str(a) for a in args], log, environ, cwd or os.getcwd())
            code = command.wait(timeout)
            return code, log.read_text() if log.exists() else ""
    proc = subprocess.run(
        [str(SHOAL), *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=environ,
    )
    return proc.returncode, proc.stdout + proc.stderr


def one_line_error(code, out, *names):
    assert code == 2, out
    assert "Traceback" not in out, out
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, out
    for name in names:
        assert name in errors[0], out


def steps_of(run_dir, suffix="jsonl"):
    if suffix == "jsonl":
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
        return [json.loads(line)["step"] for line in lines]
    rows = (run_dir / "metrics.csv").read_text().splitlines()
    column = rows[0].split(",").index("step")
    return [int(float(row.split(",")[column])) for row in rows[1:]]


# Items 2 and 6: the summary evaluates the final policy, says where, and labels its times.
def test_every_run_ends_with_an_evaluation_and_labelled_times(tmp_path):
    run_dir = tmp_path / "run"
    code, out = shoal_cli(
        "train", "ppo", "--env", "CartPole-v1", "--total-steps", "256", "--run-dir", run_dir,
        "--run.eval-every-steps", "100000", "--run.eval-episodes", "2", *SMALL,
    )  # fmt: skip
    assert code == 0, out
    assert re.search(r"stopped:\s+run.total_steps 256 reached \(256 env steps\)", out), out
    assert re.search(r"time:\s+[\d.]+ s in this process, [\d.]+ s of it training\n", out), out
    assert re.search(r"eval return: [\d.]+ at env step 256\n", out), out
    final = [json.loads(r) for r in (run_dir / "metrics.jsonl").read_text().splitlines()][-1]
    assert final["step"] == 256 and final["eval/final"] == 1 and "eval/return" in final


def test_no_evaluation_when_disabled_is_said(tmp_path):
    code, out = shoal_cli(
        "train", "ppo", "--env", "CartPole-v1", "--total-steps", "128",
        "--run-dir", tmp_path / "run", "--run.eval-every-steps", "0", *SMALL,
    )  # fmt: skip
    assert code == 0 and "eval return: none (run.eval_every_steps is 0)" in out, out


# Item 3: a single observation or a batch; anything else names the expected shapes.
def test_policy_acts_on_one_observation_or_a_batch(tmp_path):
    result = shoal.train(
        "ppo", env="CartPole-v1", total_steps=64, run_dir=str(tmp_path / "run"),
        **{"env.num_envs": 4, "num_steps": 16, "minibatch_size": 32, "model.hidden": [16],
           "run.console": False, "run.tensorboard": False, "run.eval_every_steps": 0},
    )  # fmt: skip
    policy = shoal.load(result.run_dir)
    single = policy.act(np.zeros(4, dtype=np.float32))
    assert np.ndim(single) == 0 and single in (0, 1)
    batch = policy.act(np.zeros((3, 4), dtype=np.float32))
    assert batch.shape == (3,)
    assert policy.act([0.0, 0.1, 0.0, -0.1]) in (0, 1)  # lists too
    with pytest.raises(ShoalError, match=r"one observation of shape \(4,\) or a batch"):
        policy.act(np.zeros((2, 5), dtype=np.float32))


# Item 4: a resume that raises total_steps trains on past a target it had reached.
def test_resume_with_more_steps_trains_past_a_reached_target(tmp_path):
    run_dir = tmp_path / "run"
    code, out = shoal_cli(
        "train", "ppo", "--env", "CartPole-v1", "--total-steps", "100000", "--run-dir", run_dir,
        "--target-return", "1", "--run.eval-every-steps", "64", "--run.eval-episodes", "1",
        *SMALL,
    )  # fmt: skip
    assert code == 0 and re.search(r"stopped:\s+the eval return [\d.]+ reached", out), out
    reached = int(re.search(r"at env step (\d+)", out.replace(",", "")).group(1))
    total = reached + 256
    code, out = shoal_cli("train", "--resume", run_dir, "--total-steps", total)
    assert code == 0, out
    assert "note: the run had reached its target_return 1" in out, out
    assert re.search(rf"stopped:\s+run.total_steps {total:,} reached", out), out
    assert steps_of(run_dir)[-1] == total


# Item 5: kill -9, then resume: the metric files are cut back to the checkpoint.
def test_resume_after_a_crash_cuts_the_metrics_back_and_says_so(tmp_path):
    run_dir = tmp_path / "run"
    script = textwrap.dedent(
        f"""
        import os, shoal
        def crash(steps, metrics):
            if steps >= 448:  # checkpoints at 128, 256, 384: 448 is past the last one
                os._exit(9)
        shoal.train("ppo", env="CartPole-v1", total_steps=10_000, run_dir={str(run_dir)!r},
                    on_iteration=crash, **{{"env.num_envs": 4, "num_steps": 16,
                    "minibatch_size": 32, "model.hidden": [16], "run.console": False,
                    "run.tensorboard": True, "run.eval_every_steps": 0,
                    "run.checkpoint_every_steps": 128}})
        """
    )
    crashed = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=180)
    assert crashed.returncode == 9, crashed.stderr.decode()
    assert steps_of(run_dir)[-1] == 448 and steps_of(run_dir, "csv")[-1] == 448
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    def tensorboard_steps():
        events = EventAccumulator(str(run_dir / "tb"))
        events.Reload()
        return [e.step for e in events.Scalars("loss/total")]

    assert tensorboard_steps()[-1] >= 384  # flushed with each checkpoint
    code, out = shoal_cli("train", "--resume", run_dir, "--total-steps", "640")
    assert code == 0, out
    assert "resumed from step 384 (64 steps since the last checkpoint were lost)" in out, out
    expected = list(range(64, 641, 64))
    assert steps_of(run_dir) == expected and steps_of(run_dir, "csv") == expected
    assert tensorboard_steps() == expected  # purged past the checkpoint


# Item 7: unwritable run directories and YAML values of the wrong type are one line.
def test_an_unwritable_run_directory_is_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    code, out = shoal_cli(
        "train", "ppo", "--env", "CartPole-v1", "--run-dir", blocker / "run", *SMALL
    )
    one_line_error(code, out, "cannot write", str(blocker))


def test_an_unwritable_run_on_resume_is_one_line(tmp_path):
    run_dir = tmp_path / "run"
    code, out = shoal_cli(
        "train", "ppo", "--env", "CartPole-v1", "--total-steps", "64", "--run-dir", run_dir,
        "--run.eval-every-steps", "0", *SMALL,
    )  # fmt: skip
    assert code == 0, out
    (run_dir / "metrics.jsonl").unlink()
    (run_dir / "metrics.jsonl").mkdir()  # cannot be opened as a file
    code, out = shoal_cli("train", "--resume", run_dir, "--total-steps", "128")
    one_line_error(code, out, "cannot write", "metrics.jsonl")


def test_a_yaml_value_of_the_wrong_type_is_one_line(tmp_path):
    config = tmp_path / "exp.yaml"
    config.write_text(
        "algo: ppo\nexpected: anything\nconfig:\n  env: {id: CartPole-v1}\n  num_epochs: four\n"
    )
    code, out = shoal_cli("train", "--config", config, "--run-dir", tmp_path / "run")
    one_line_error(code, out, "PPOConfig.num_epochs", "must be an integer", "'four'")
    assert not (tmp_path / "run").exists()


# Item 8: a start that fails leaves no run directory behind.
@pytest.mark.parametrize(
    "args, message",
    [
        (["ppo", "--env", "CartPol-v1"], "unknown environment id 'CartPol-v1'"),
        (["ppo", "--env", "Ant-v2"], "needs mujoco-py"),
        (["ddpg", "--env", "CartPole-v1"], "Discrete"),  # found once the env is built
    ],
)
def test_a_failed_start_leaves_no_run_directory(tmp_path, args, message):
    code, out = shoal_cli("train", *args, "--total-steps", "64", cwd=tmp_path)
    assert code == 2 and "Traceback" not in out and message in out, out
    assert not (tmp_path / "runs").exists(), list((tmp_path / "runs").iterdir())


def test_a_failed_start_in_a_new_nested_run_dir_removes_what_it_made(tmp_path):
    code, out = shoal_cli(
        "train", "ppo", "--env", "CartPol-v1", "--run-dir", tmp_path / "a" / "b" / "run"
    )
    one_line_error(code, out, "CartPol-v1")
    assert not (tmp_path / "a").exists()


# Item 9: help for the train command.
def test_train_help_says_what_it_takes():
    code, out = shoal_cli("train", "--help")
    assert code == 0 and "Traceback" not in out, out
    for what in ("shoal train ALGO", "--tuned NAME", "--resume RUN_DIR", "shoal list"):
        assert what in out, out


# Items 10 and 11: listings (an algorithm's action spaces wrap rather than being cut).
def test_list_is_one_line_per_algorithm_and_tuned_example():
    code, out = shoal_cli("list")
    assert code == 0, out
    lines = out.splitlines()
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    algorithms, tuned = len(shoal.ALGORITHMS), len(shoal.registry.tuned_examples())
    assert len(lines) <= 3 * algorithms + tuned + 16  # titles, rules, headers and a hint
    for name in (*shoal.ALGORITHMS, *shoal.registry.tuned_examples()):
        assert re.search(rf"^\S*\s*{re.escape(name)}\s", out, re.M), name
    code, long = shoal_cli("list", "--long")
    assert code == 0 and len(long.splitlines()) > len(lines)
    assert "clipped surrogate, GAE, adaptive KL" in " ".join(long.split())


@pytest.mark.extra("atari", "mujoco", "pettingzoo")
def test_list_envs_groups_what_works_and_says_why_the_rest_does_not():
    code, out = shoal_cli("list", "--envs")
    assert code == 0, out
    for title in ("Gymnasium classic control", "MuJoCo (Gymnasium)", "Atari (ale-py)",
                  "shoal built-in, multi-agent", "PettingZoo"):  # fmt: skip
        assert title in out, title
    words = out.split()
    for env_id in ("CartPole-v1", "HalfCheetah-v5", "Pong", "shoal/spread-v0", "shoal/cn-v1-v0"):
        assert env_id in words, env_id
    assert "pettingzoo:mpe2.simple_spread_v3" in out
    assert re.search(r"Ant-v2: needs mujoco-py .*; use Ant-v5", out), out
    assert "Ant-v2" not in out.split("registered but not usable here")[0]


# Item 12: a user's own env, from the working directory, then evaluated and loaded elsewhere.
CUSTOM_ENV = '''
import gymnasium as gym
import numpy as np


class Corridor(gym.Env):
    """Walk right to the end of a corridor of 4 cells."""

    def __init__(self):
        self.observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)
        self.action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = 0
        return np.array([0.0], np.float32), {}

    def step(self, action):
        self.pos = max(0, self.pos + (1 if action == 1 else -1))
        done = self.pos >= 4
        return np.array([self.pos / 4], np.float32), float(done), done, False, {}


gym.register("Corridor-v0", entry_point=Corridor, max_episode_steps=20)
'''


def test_a_custom_env_from_the_working_directory(tmp_path):
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir()
    elsewhere.mkdir()
    (project / "my_envs.py").write_text(CUSTOM_ENV)
    code, out = shoal_cli(
        "train", "ppo", "--env", "my_envs:Corridor-v0", "--total-steps", "128",
        "--run.eval-episodes", "2", *SMALL, cwd=project, fresh=True,
    )  # fmt: skip
    assert code == 0, out
    [run_dir] = (project / "runs").iterdir()
    assert ":" not in run_dir.name and run_dir.name.startswith("ppo-my_envs_Corridor-v0-")
    # From elsewhere the env's module comes from the directory the run records only when the
    # user trusts the run's code.
    code, out = shoal_cli("eval", run_dir, "--episodes", "2", cwd=elsewhere, fresh=True)
    assert code == 2 and "module 'my_envs'" in out and "--trust-code" in out, out
    code, out = shoal_cli(
        "eval", run_dir, "--episodes", "2", "--trust-code", cwd=elsewhere, fresh=True
    )
    assert code == 0 and "2 episodes on my_envs:Corridor-v0" in out, out

    # The spaces are in the checkpoint: the policy loads and acts without the env's module.
    shutil.move(project / "my_envs.py", tmp_path / "moved.py")
    act = f"import shoal; print(shoal.load({str(run_dir)!r}).act([0.5]))"
    loaded = subprocess.run(
        [sys.executable, "-c", act], cwd=elsewhere, capture_output=True, text=True, timeout=120
    )
    assert loaded.returncode == 0 and loaded.stdout.strip() in ("0", "1"), loaded.stderr
    code, out = shoal_cli("eval", run_dir, "--episodes", "1", cwd=elsewhere, fresh=True)
    one_line_error(code, out, "cannot import module 'my_envs'", "PYTHONPATH")


def test_a_module_that_is_not_there_names_the_fix(tmp_path):
    code, out = shoal_cli("train", "ppo", "--env", "nowhere:Thing-v0", cwd=tmp_path, fresh=True)
    one_line_error(code, out, "cannot import module 'nowhere'", "Run shoal from the directory")


# Item 13: run directory names are safe on every file system.
@pytest.mark.parametrize(
    "env_id", ["pettingzoo:mpe2.simple_spread_v3", "my_envs:Corridor-v0", "ALE/Pong-v5"]
)
def test_run_directory_names_are_filesystem_safe(env_id):
    name = default_run_dir("ppo", env_id).name
    assert re.fullmatch(r"[A-Za-z0-9._-]+", name), name


# The README's quick start, as written.
def test_the_readme_quick_start_runs_as_written(tmp_path):
    readme = (REPO / "README.md").read_text()
    setup = readme.split("## Set-up: two commands", 1)[1].split("```bash", 1)[1].split("```")[0]
    commands = [line.split("#")[0].strip() for line in setup.strip().splitlines()]
    assert commands == ["make train", "make test"]  # make test is what runs this file
    run_dir = tmp_path / "quick-start"
    proc = subprocess.run(
        ["make", "--no-print-directory", "train", f"TRAIN_ARGS=--run-dir {run_dir}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "Traceback" not in out, out
    # What the README says it prints.
    assert re.search(r"stopped:\s+the eval return [\d.]+ reached run.target_return 475", out), out
    assert f"run:         {run_dir}" in out and (run_dir / "checkpoints" / "latest").exists()


def test_every_optional_extra_is_known_to_the_test_skips():
    """A test marked ``extra(name)`` skips, naming the install, where the extra is missing
    (tests/conftest.py): every extra pyproject.toml declares for users has its modules
    listed there."""
    import tomllib
    from conftest import EXTRAS, missing_extras

    project = Path(__file__).parent.parent / "pyproject.toml"
    extras = tomllib.loads(project.read_text())["project"]["optional-dependencies"]
    assert set(extras) - {"dev", "bench"} == set(EXTRAS)
    assert missing_extras(["report"]) == (
        [] if importlib.util.find_spec("matplotlib") else ["report"]
    )
