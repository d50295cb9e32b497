"""The `shoal` command line: train, resume, eval (with video), list, and its error messages."""

import contextlib
import json
import re
import signal

import pytest

from shoal.cli import main
from shoal.config import RenamedFieldWarning

QUIET_SMALL = [
    "--env.num-envs", "4", "--num-steps", "16", "--minibatch-size", "32", "--num-epochs", "1",
    "--model.hidden", "16", "--run.eval-every-steps", "0", "--run.no-console",
    "--run.no-tensorboard",
]  # fmt: skip


def train_args(run_dir, steps=128, *extra):
    return ["train", "ppo", "--env", "CartPole-v1", "--total-steps", str(steps),
            "--run-dir", str(run_dir), *QUIET_SMALL, *extra]  # fmt: skip


def test_train_prints_run_and_checkpoint(tmp_path, capsys):
    assert main(train_args(tmp_path / "run", 128, "--seed", "3")) == 0
    out = capsys.readouterr().out
    assert f"run:         {tmp_path / 'run'}" in out
    assert "checkpoint:" in out and "step_000000000128" in out
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["run"]["seed"] == 3 and config["num_steps"] == 16
    assert config["model"]["hidden"] == [16]


def test_train_resume_continues_the_run(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert main(train_args(run_dir, 128)) == 0
    assert main(["train", "--resume", str(run_dir), "--total-steps", "256"]) == 0
    assert "step_000000000256" in capsys.readouterr().out
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [64, 128, 192, 256]


def test_train_from_yaml_config(tmp_path, capsys):
    config = tmp_path / "exp.yaml"
    config.write_text(
        "algo: ppo\nexpected: anything\nconfig:\n  env: {id: CartPole-v1, num_envs: 4}\n"
        "  num_steps: 16\n  minibatch_size: 32\n  run: {total_steps: 64}\n"
    )
    args = ["train", "--config", str(config), "--run-dir", str(tmp_path / "run")]
    assert main([*args, "--run.no-console", "--run.no-tensorboard"]) == 0
    assert (tmp_path / "run" / "checkpoints" / "latest").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["train", "ppo", "--env", "CartPol-v1"], "CartPole-v1"),
        (["train", "pp0"], "unknown algorithm 'pp0'"),
        (["train", "--tuned", "ppo-cartpol"], "Did you mean ppo-cartpole"),
        (["train", "--resume", "/no/such/run"], "no such run"),
        (["train"], "name an algorithm"),
        # Square brackets survive the console's markup (a path like this once lost them).
        (["train", "--config", "exp[1].yaml"], "config file exp[1].yaml does not exist"),
        (["eval", "/no/such/run"], "no such run"),
    ],
)
def test_bad_input_is_one_clear_error(args, message, tmp_path, capsys):
    assert main(args) == 2
    out = capsys.readouterr().out
    assert "error:" in out and message in out.replace("\n", " ")


@pytest.mark.parametrize(
    "command, text, message",
    [
        ("train", "algo: ppo\nconfig: {env: [\n", "is not valid YAML at line 3, column 1"),
        ("tune", "name: s\nsearch: {a: [\n", "is not valid YAML at line 3, column 1"),
        pytest.param("tune", "name: s\nbase: ppo-cartpole\nsearch: {optim.lr: loguniform(1e-5,"
                     " 1e-2)}\n", "was cut at a comma", marks=pytest.mark.extra("tune")),
        pytest.param("tune", "name: s\nbase: ppo-cartpole\nsearch: {optim.lr: 'normal(0, 1)'}\n",
                     "is not a distribution", marks=pytest.mark.extra("tune")),
    ],
)  # fmt: skip
def test_a_bad_yaml_file_is_one_clear_error(command, text, message, tmp_path, capsys):
    path = tmp_path / "file.yaml"
    path.write_text(text)
    args = [command, "--config", str(path)] if command == "train" else [command, str(path)]
    assert main(args) == 2
    out = capsys.readouterr().out
    assert "error:" in out and message in out.replace("\n", " ")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--clip-eps", "-1"], "PPOConfig.clip_eps = -1.0 is invalid: must be > 0"),
        (["--model.activation", "gelu"], "gelu"),
        (["--no-such-field", "1"], "no-such-field"),
    ],
)
def test_bad_field_values_are_rejected_by_the_parser(args, message, capsys):
    # tyro validates while parsing (our __post_init__ checks run inside it) and exits with 2;
    # tyro 0.9 lets the config's own error through instead, which main reports with status 2.
    try:
        status = main(["train", "ppo", *args])
    except SystemExit as exc:
        status = exc.code
    assert status == 2
    out = capsys.readouterr()
    assert message in (out.err + out.out).replace("\n", " ")


@pytest.mark.parametrize("suffix", [".gif", pytest.param(".mp4", marks=pytest.mark.extra("video"))])
def test_eval_and_video(suffix, tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert main(train_args(run_dir, 64)) == 0
    video = tmp_path / f"cartpole{suffix}"
    args = ["eval", str(run_dir), "--episodes", "3", "--video", str(video)]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "3 episodes on CartPole-v1: return" in out
    assert "players:" not in out  # one trained player: nothing to name
    assert video.exists() and video.stat().st_size > 0
    import imageio.v2 as imageio

    frames = imageio.mimread(video)
    assert len(frames) > 2 and frames[0].ndim == 3  # RGB frames of the rendered episode


def test_eval_statistics_with_a_bootstrap_interval_and_json(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert main(train_args(run_dir, 64)) == 0
    capsys.readouterr()
    assert main(["eval", str(run_dir), "--episodes", "6", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    r = report["return"]
    assert report["episodes"] == 6 and r["n"] == 6 and report["deterministic"] is True
    assert r["min"] <= r["ci_low"] <= r["mean"] <= r["ci_high"] <= r["max"]
    assert r["min"] <= r["median"] <= r["max"] and r["std"] >= 0
    saved = tmp_path / "eval.json"
    assert main(["eval", str(run_dir), "--episodes", "6", "--json", str(saved)]) == 0
    out = capsys.readouterr().out
    assert "95% CI" in out and "median" in out
    assert json.loads(saved.read_text())["return"] == r  # same seed, same episodes


def test_list_shows_algorithms_and_tuned_examples(capsys, monkeypatch):
    """At 80 columns: every line fits, and every action space of every learner is stated
    (the descriptions may be cut; --long has them)."""
    from shoal.cli import console
    from shoal.registry import ALGORITHMS

    monkeypatch.setattr(console, "_width", 80)
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "ppo" in out and "ppo-cartpole" in out and "ppo-pendulum" in out
    assert max(map(len, out.splitlines())) <= 80
    table = out.split("tuned examples")[0]
    cells = {}  # algorithm -> its actions cell, joined over its wrapped lines
    name = None
    for line in table.splitlines():
        parts = [p.strip() for p in line.split("│")]
        if len(parts) == 5:
            name = parts[1] or name
            cells[name] = (cells.get(name, "") + " " + parts[2]).strip()
    for spec in ALGORITHMS.values():
        assert cells[spec.name] == " ".join(spec.action_spaces.split()), spec.name


def test_list_envs(capsys):
    assert main(["list", "--envs"]) == 0
    assert "CartPole-v1" in capsys.readouterr().out.split()


@pytest.mark.parametrize(
    ("signame", "code", "said"),
    [("SIGINT", 130, r"stopped:\s+interrupted \(Ctrl-C\)"),
     ("SIGTERM", -signal.SIGTERM, r"SIGTERM: the run is saved in \S+; terminating")],
)  # fmt: skip
def test_a_stop_signal_to_a_real_process_saves_and_exits(tmp_path, signame, code, said):
    """The user's path: Ctrl-C (SIGINT) to a running `shoal train` saves a checkpoint and
    exits 130; SIGTERM from `kill`, `timeout` or a batch scheduler saves one too, then ends
    the process as SIGTERM does (the shell sees 143)."""
    import os
    import subprocess
    import sys
    import time

    run_dir = tmp_path / "run"
    args = train_args(run_dir, 10_000_000)
    proc = subprocess.Popen(
        [sys.executable, "-m", "shoal.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        # as from a terminal: a test run started in the background ignores SIGINT, and a
        # process inherits that (shoal then leaves the signal ignored, as it should)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    metrics = run_dir / "metrics.jsonl"
    deadline = time.time() + 60
    while time.time() < deadline and not (metrics.exists() and metrics.stat().st_size):
        time.sleep(0.1)
    proc.send_signal(getattr(signal, signame))
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == code, out
    assert re.search(said, out), out
    assert f"shoal train --resume {run_dir}" in out  # the exact command that goes on
    latest = (run_dir / "checkpoints" / "latest").read_text().strip()
    assert (run_dir / "checkpoints" / latest / "state.pt").exists()


DQN_SMALL = [
    "--env", "CartPole-v1", "--env.num-envs", "2", "--rollout-steps", "8", "--total-steps", "32",
    "--model.hidden", "16", "--run.eval-every-steps", "0", "--run.no-console",
    "--run.no-tensorboard",
]  # fmt: skip


def test_replay_flags_and_their_old_names(tmp_path):
    """Today's nested flags, and shoal 0.1's flat ones, which still work with a warning."""
    new = tmp_path / "new"
    args = ["train", "dqn", *DQN_SMALL, "--run-dir", str(new), "--replay.buffer-size", "300",
            "--replay.prioritized", "rank", "--replay.learning-starts", "8",
            "--replay.batch-size", "4"]  # fmt: skip
    assert main(args) == 0
    replay = json.loads((new / "config.json").read_text())["replay"]
    assert (replay["buffer_size"], replay["prioritized"], replay["batch_size"]) == (300, "rank", 4)
    old = tmp_path / "old"
    args = ["train", "dqn", *DQN_SMALL, "--run-dir", str(old), "--buffer-size", "300",
            "--replay", "uniform", "--learning-starts", "8", "--batch-size=4",
            "--save-replay"]  # fmt: skip
    with pytest.warns(RenamedFieldWarning) as caught:
        assert main(args) == 0
    assert "config field 'buffer_size' is now 'replay.buffer_size'" in str(caught[0].message)
    replay = json.loads((old / "config.json").read_text())["replay"]
    assert replay["buffer_size"] == 300 and replay["prioritized"] == "none"
    assert replay["batch_size"] == 4 and replay["save"] is True


def test_a_flag_no_version_had_is_refused_by_name(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["train", "dqn", *DQN_SMALL, "--run-dir", str(tmp_path), "--bufer-size", "3"])
    assert "--bufer-size" in capsys.readouterr().err


def test_variant_blocks_on_the_command_line(tmp_path):
    args = ["train", "a3c", "--env", "CartPole-v1", "--runners", "0", "--env.num-envs", "2",
            "--a2c.num-steps", "8", "--a2c.optim.lr", "0.01", "--total-steps", "32",
            "--run-dir", str(tmp_path / "a3c"), "--run.eval-every-steps", "0",
            "--run.no-console", "--run.no-tensorboard"]  # fmt: skip
    assert main(args) == 0
    config = json.loads((tmp_path / "a3c" / "config.json").read_text())
    assert config["a2c"]["num_steps"] == 8 and config["a2c"]["optim"]["lr"] == 0.01


@pytest.mark.extra("pettingzoo")
def test_eval_and_video_of_several_learning_groups(tmp_path, capsys):
    """A MADDPG run on a mixed game deploys every group's actors together: eval reports the
    return per group and the video shows the multi-agent env."""
    run_dir = tmp_path / "adversary"
    args = ["train", "maddpg", "--env.id", "pettingzoo:mpe2.simple_adversary_v3",
            "--env.num-envs", "2", "--env.kwargs", "max_cycles", "5", "--rollout-steps", "4",
            "--replay.learning-starts", "8", "--replay.batch-size", "8",
            "--run.total-steps", "24", "--run.eval-every-steps", "0", "--run.no-console",
            "--run.no-tensorboard", "--run.run-dir", str(run_dir)]  # fmt: skip
    assert main(args) == 0
    video = tmp_path / "adversary.gif"
    assert main(["eval", str(run_dir), "--episodes", "2", "--video", str(video)]) == 0
    out = capsys.readouterr().out
    # Opposing groups are reported apart, never averaged into one return.
    assert "2 episodes on pettingzoo:mpe2.simple_adversary_v3, length 5.0: return per group" in out
    assert "±" not in out and " adversary " in out and ", agent " in out
    assert video.exists() and video.stat().st_size > 0
    assert main(["eval", str(run_dir), "--episodes", "2", "--fixed", "adversary", "random"]) == 0
    assert "players: adversary random, agent trained" in capsys.readouterr().out
    assert main(["eval", str(run_dir), "--fixed", "prey", "random"]) == 2
    assert "no groups or agents ['prey'] in this env" in capsys.readouterr().out


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["-h"],
        *([name, "--help"] for name in ["eval", "experiment", "tune", "report", "export", "list"]),
    ],  # fmt: skip
)
def test_help_of_the_command_and_of_each_subcommand(args, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(args)
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith("usage: shoal")


def test_budgets_in_scientific_notation(monkeypatch):
    import shoal.api

    built = []
    monkeypatch.setattr(shoal.api, "train", lambda config, resume=None, **_: built.append(config))
    with contextlib.suppress(AttributeError):  # the stub returns no result to print
        main(["train", "ppo", "--total-steps", "1e5", "--run.eval-every-steps", "2.5E4",
              "--optim.lr", "3e-4"])  # fmt: skip
    assert built[0].run.total_steps == 100_000 and built[0].run.eval_every_steps == 25_000
    assert built[0].optim.lr == 3e-4
    with pytest.raises(SystemExit):  # not a whole number: tyro refuses it
        main(["train", "ppo", "--total-steps", "1.5e0"])


def test_resuming_a_run_that_reached_its_target(tmp_path, capsys):
    """A plain --resume stops at once (the README's promise); only a raised total trains on,
    without the reached target."""
    run_dir = tmp_path / "run"
    args = train_args(run_dir, 512, "--run.target-return", "5", "--run.eval-every-steps", "64")
    assert main(args) == 0
    first = json.loads(next((run_dir / "checkpoints").glob("step_*/meta.json")).read_text())
    assert "reached run.target_return 5" in capsys.readouterr().out
    assert main(["train", "--resume", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "nothing to train (raise --run.total-steps to train on)" in out
    assert f"step_{first['env_steps']:012d}" in out  # no step trained
    assert main(["train", "--resume", str(run_dir), "--total-steps", "640"]) == 0
    out = capsys.readouterr().out
    assert "training on to run.total_steps 640 without a target" in out
    assert "run.total_steps 640 reached" in out


def test_the_resume_note_says_what_was_not_restored(tmp_path, capsys):
    """DQN without replay.save: the note names the replay (by its current field name) and
    not the episodes, which CartPole's snapshots restore."""
    run_dir = tmp_path / "run"
    small = ["--replay.learning-starts", "64", "--replay.batch-size", "16",
             "--run.eval-every-steps", "0", "--run.no-console", "--run.no-tensorboard"]  # fmt: skip
    assert main(["train", "dqn", "--env", "CartPole-v1", "--total-steps", "128",
                 "--run-dir", str(run_dir), *small]) == 0  # fmt: skip
    capsys.readouterr()
    assert main(["train", "--resume", str(run_dir), "--total-steps", "192"]) == 0
    out = capsys.readouterr().out
    assert "note: this resume is not exact: the replay buffer was not saved (replay.save" in out
    assert "save_replay" not in out and "mid-episode" not in out


def test_a_resume_on_another_env_says_so_and_leaves_the_run_as_it_was(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert main(train_args(run_dir, 128)) == 0
    config = (run_dir / "config.json").read_text()
    capsys.readouterr()
    assert main(["train", "--resume", str(run_dir), "--env", "Acrobot-v1",
                 "--total-steps", "256"]) == 2  # fmt: skip
    out = " ".join(capsys.readouterr().out.split())
    assert "it changes env.id ('CartPole-v1' -> 'Acrobot-v1')" in out
    assert "another shoal version" not in out
    assert (run_dir / "config.json").read_text() == config
