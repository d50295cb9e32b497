"""What ``shoal train`` and ``shoal eval`` say at the end: a run's own evaluation where it
evaluates by matches, only the commands that work for the run, one note per fallback. Each
test failed before its fix."""

import re

import pytest

from shoal.cli import main

SMALL_AZ = [
    "--env", "openspiel:tic_tac_toe", "--env.num-envs", "2", "--search.num-simulations", "4",
    "--moves-per-iteration", "4", "--min-replay", "8", "--batch-size", "8",
    "--run.no-console",
]  # fmt: skip


SMALL_PPO = ["--num-steps", "16", "--num-envs", "4", "--minibatch-size", "32"]


@pytest.mark.extra("openspiel")
def test_alphazero_says_its_match_scores(tmp_path, capsys):
    """AlphaZero evaluates by matches and used to print "eval return: none"."""
    run_dir = tmp_path / "az"
    args = ["train", "alphazero", *SMALL_AZ, "--eval-every", "2", "--eval-games", "2",
            "--total-steps", "32", "--run-dir", str(run_dir)]  # fmt: skip
    assert main(args) == 0
    out = capsys.readouterr().out
    assert re.search(r"eval:\s+vs_random score [\d.]+, vs_minimax score [\d.]+, vs_minimax "
                     r"loss_rate [\d.]+ at env step 32\n", out), out  # fmt: skip
    assert "eval return: none" not in out
    # Before its first matches, it says when they come.
    assert main(["train", "alphazero", *SMALL_AZ, "--eval-every", "50", "--total-steps", "16",
                 "--run-dir", str(tmp_path / "early")]) == 0  # fmt: skip
    assert (
        "eval return: none yet (alphazero plays its evaluation matches every eval_every "
        "iterations: 50)" in capsys.readouterr().out
    )


def test_mcts_suggests_no_shoal_eval_and_no_tensorboard_when_off(tmp_path, capsys):
    run_dir = tmp_path / "mcts"
    args = ["train", "--tuned", "mcts-planning", "--total-steps", "100", "--run-dir",
            str(run_dir), "--run.no-console", "--run.no-tensorboard"]  # fmt: skip
    assert main(args) == 0
    out = capsys.readouterr().out
    assert f"shoal eval {run_dir}" not in out and "mcts keeps no policy" in out
    assert "tensorboard" not in out
    assert main(["eval", str(run_dir)]) == 2  # what the summary no longer suggests
    capsys.readouterr()
    ppo = tmp_path / "ppo"
    assert main(["train", "ppo", *SMALL_PPO, "--total-steps", "64", "--run-dir", str(ppo),
                 "--run.no-console"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert f"evaluate:    shoal eval {ppo}" in out and f"tensorboard --logdir {ppo}" in out
    assert "resume:" not in out  # a run that ended: nothing to resume


def test_a_fallback_note_is_one_line_said_once(tmp_path, capsys):
    """`shoal eval` reads a run's checkpoint, then its policy: the note on a damaged newest
    checkpoint came twice, once with PyTorch's paragraph of advice."""
    run_dir = tmp_path / "r"
    assert main(["train", "ppo", *SMALL_PPO, "--total-steps", "128",
                 "--run.checkpoint-every-steps", "64", "--run-dir", str(run_dir),
                 "--run.no-console", "--run.eval-every-steps", "0"]) == 0  # fmt: skip
    state = run_dir / "checkpoints" / "step_000000000128" / "state.pt"
    state.write_bytes(state.read_bytes()[:1000])  # cut short
    capsys.readouterr()
    assert main(["eval", str(run_dir), "--episodes", "2"]) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note:")]
    assert len(notes) == 1, notes
    assert "using step_000000000064" in notes[0] and "internal" not in notes[0]
