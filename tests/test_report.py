"""``shoal report``: final-score tables (mean, median, IQM with bootstrap intervals,
optimality gap), probabilities of improvement and curves, on hand-made runs with known
scores, for an experiment directory and a plain directory of runs."""

import csv
import json

import numpy as np
import pytest

from shoal.cli import main
from shoal.studies.report import probability_of_improvement, report

FINALS = {"fast": [10.0, 12.0, 14.0, 40.0], "slow": [5.0, 6.0, 12.0, 8.0]}

pytestmark = pytest.mark.extra("report")


def write_run(run_dir, finals, target=None, agents=False):
    run_dir.mkdir(parents=True)
    rows = []
    for i, step in enumerate((1000, 2000, 3000)):
        score = finals * (i + 1) / 3
        rows.append({"step": step, "perf/iteration_s": 2.0})
        row = {"step": step, "eval/return": score}
        if agents:
            row.update({"eval/return/agent_0": score + 1, "eval/return/agent_1": score - 1})
        rows.append(row)
    (run_dir / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (run_dir / "config.json").write_text(json.dumps({"run": {"target_return": target},
                                                     "env": {"id": "Toy-v0"}}))  # fmt: skip


def make_experiment(root, agents=False):
    runs = []
    for variant, finals in FINALS.items():
        for k, final in enumerate(finals):
            name = f"{variant}-s{k}"
            write_run(root / name, final, target=20.0, agents=agents)
            runs.append({"name": name, "variant": variant, "values": {}, "seed": k, "algo": "ppo"})
    (root / "experiment.json").write_text(json.dumps({"name": "toy", "runs": runs}))


def test_scores_and_improvement_against_hand_computed_values(tmp_path):
    make_experiment(tmp_path / "exp")
    tables = report(tmp_path / "exp")
    fast, slow = tables["scores"]
    assert fast["variant"] == "fast" and fast["runs"] == 4
    assert fast["mean"] == pytest.approx(19.0) and fast["median"] == pytest.approx(13.0)
    assert fast["iqm"] == pytest.approx(13.0)  # 12 and 14, the middle of 10, 12, 14, 40
    # The mean's 95% percentile-bootstrap interval: the exact bootstrap distribution (the 256
    # equally likely resamples of 4 runs) puts its 2.5% and 97.5% quantiles at 11 and 33.
    assert fast["mean_low"] == pytest.approx(11.0, abs=0.5)
    assert fast["mean_high"] == pytest.approx(33.0, abs=1.0)
    assert (slow["mean_low"], slow["mean_high"]) == pytest.approx((5.5, 10.5), abs=0.5)
    # Optimality gap to the target 20: mean of max(20 - score, 0) = (10 + 8 + 6 + 0) / 4.
    assert fast["optimality_gap"] == pytest.approx(6.0)
    assert fast["wall_s"] == pytest.approx(6.0) and fast["steps"] == 3000
    # P(fast > slow): of the 16 pairs fast wins 14 (all but 10 < 12) and ties one (12, 12).
    pairs = {(r["x"], r["y"]): r["p_x_better"] for r in tables["improvement"]}
    assert pairs["fast", "slow"] == pytest.approx(14.5 / 16)
    assert pairs["fast", "slow"] + pairs["slow", "fast"] == pytest.approx(1.0)
    assert probability_of_improvement([1, 2], [1, 2]) == 0.5
    out = tmp_path / "exp" / "report"
    for name in ("curves_steps.png", "curves_wall.png", "curves_steps.svg", "scores.md"):
        assert (out / name).stat().st_size > 0
    rows = list(csv.DictReader((out / "scores.csv").open()))
    assert [r["variant"] for r in rows] == ["fast", "slow"] and float(rows[1]["mean"]) == 7.75


def test_per_agent_tables_and_curves_of_multi_agent_runs(tmp_path):
    make_experiment(tmp_path / "exp", agents=True)
    tables = report(tmp_path / "exp")
    assert set(tables["agents"]) == {"agent_0", "agent_1"}
    assert tables["agents"]["agent_0"][0]["mean"] == pytest.approx(20.0)
    assert (tmp_path / "exp" / "report" / "curves_steps_agent_1.png").stat().st_size > 0


def test_a_plain_directory_of_runs_and_the_command_line(tmp_path, capsys):
    for k, final in enumerate(FINALS["slow"]):
        write_run(tmp_path / "runs" / f"run{k}", final)
    assert main(["report", str(tmp_path / "runs"), "--out", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert "Toy-v0" in out and "7.75" in out
    assert main(["report", str(tmp_path / "nothing")]) == 2  # no runs: a clear error
    assert "no runs with evaluations" in capsys.readouterr().out


def write_evaluations(run_dir, steps, scores, target=None, env="Toy-v0"):
    run_dir.mkdir(parents=True)
    rows = [{"step": s, "perf/iteration_s": 1.0, "eval/return": v}
            for s, v in zip(steps, scores, strict=True)]  # fmt: skip
    (run_dir / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (run_dir / "config.json").write_text(json.dumps({"run": {"target_return": target},
                                                     "env": {"id": env}}))  # fmt: skip


def test_curves_use_every_seed_and_a_seed_that_stopped_holds_its_final_score(tmp_path):
    """Seed a reached its target at 2,000 steps and stopped; seed b ran to 4,000 and fell
    back; c evaluated on another schedule. Every point of the curve averages all three."""
    from shoal.studies.report import collect, curve

    write_evaluations(tmp_path / "a", [1000, 2000], [100.0, 470.0], target=450.0)
    write_evaluations(tmp_path / "b", [1000, 2000, 3000, 4000], [100.0, 400.0, 300.0, 122.0],
                      target=450.0)  # fmt: skip
    write_evaluations(tmp_path / "c", [1000, 2500, 4000], [40.0, 190.0, 340.0], target=450.0)
    runs = collect(tmp_path)
    grid, mean, low, high = curve(runs, "", "steps", points=7)  # every 500 steps
    assert grid.tolist() == [1000, 1500, 2000, 2500, 3000, 3500, 4000]
    a = [100, 285, 470, 470, 470, 470, 470]  # held from its end at 2,000
    b = [100, 250, 400, 350, 300, 211, 122]
    c = [40, 90, 140, 190, 240, 290, 340]  # interpolated between its own evaluations
    np.testing.assert_allclose(mean, (np.array(a) + np.array(b) + np.array(c)) / 3)
    assert np.all(low <= mean + 1e-9) and np.all(mean <= high + 1e-9)
    rows = report(tmp_path)["scores"]
    assert rows[0]["mean"] == pytest.approx((470 + 122 + 340) / 3)
    assert rows[0]["optimality_gap"] == pytest.approx((0 + 328 + 110) / 3)


def test_mixed_targets_few_seeds_and_mixed_envs_are_said_not_computed(tmp_path, capsys):
    # Two runs of one variant, one with a target return and one without.
    write_evaluations(tmp_path / "runs" / "x", [1000], [10.0], target=20.0)
    write_evaluations(tmp_path / "runs" / "y", [1000], [30.0])
    tables = report(tmp_path / "runs", plots=False)
    (row,) = tables["scores"]
    assert "optimality_gap" not in row and row["note"].startswith("1 of 2 runs have a target")
    # 2 runs: statistics but no interval, and no probability of improvement.
    assert row["mean"] == 20.0 and "mean_low" not in row and tables["improvement"] == []
    assert main(["report", str(tmp_path / "runs"), "--out", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert "20.00 [n/a]" in out and "fewer than 3: no interval" in out and ") = " not in out
    assert "95% percentile bootstrap over runs" in out
    assert "percentile bootstrap" in (tmp_path / "r" / "scores.md").read_text()
    # One experiment variant whose runs are of different envs cannot be aggregated.
    exp = tmp_path / "exp"
    write_evaluations(exp / "r0", [1000], [1.0], env="A-v0")
    write_evaluations(exp / "r1", [1000], [2.0], env="B-v0")
    plan = [{"name": f"r{k}", "variant": "v", "values": {}, "seed": k, "algo": "ppo"}
            for k in range(2)]  # fmt: skip
    (exp / "experiment.json").write_text(json.dumps({"name": "e", "runs": plan}))
    assert main(["report", str(exp)]) == 2
    assert "mixes runs of different envs (A-v0, B-v0)" in capsys.readouterr().out


def test_a_run_with_unreadable_files_one_run_and_envs_apart(tmp_path, capsys):
    """A damaged meta.json crashed the report (shoal eval falls back on the same run); a run
    directory given alone found no runs; variants of different envs were compared."""
    runs = tmp_path / "runs"
    for k, final in enumerate([1.0, 2.0, 3.0]):
        write_evaluations(runs / f"a{k}", [1000], [final], env="A-v0")
        write_evaluations(runs / f"b{k}", [1000], [10 * final], env="B-v0")
    meta = runs / "a0" / "checkpoints" / "step_000000001000" / "meta.json"
    meta.parent.mkdir(parents=True)
    meta.write_text('{"algo": "pp')  # cut short by a crash
    older = runs / "a1" / "checkpoints" / "step_000000000500" / "meta.json"
    older.parent.mkdir(parents=True)
    older.write_text(json.dumps({"algo": "ppo"}))
    (runs / "a1" / "checkpoints" / "step_000000001000").mkdir()
    (runs / "a1" / "checkpoints" / "step_000000001000" / "meta.json").write_text("{")
    tables = report(runs, plots=False)
    variants = {row["variant"]: row["runs"] for row in tables["scores"]}
    assert variants == {"A-v0": 2, "ppo A-v0": 1, "B-v0": 3}  # the newest readable algo
    # Each env's variants alone: B-v0 has 3 runs, A-v0's are split, so no pair is compared.
    assert tables["improvement"] == []
    one = report(runs / "b2", tmp_path / "one", plots=False)
    assert [row["runs"] for row in one["scores"]] == [1] and one["scores"][0]["mean"] == 30.0
    assert main(["report", str(runs / "b2"), "--out", str(tmp_path / "cli")]) == 0
    assert "30.00" in capsys.readouterr().out


def test_probabilities_of_improvement_pair_variants_of_one_env(tmp_path):
    exp = tmp_path / "exp"
    plan = []
    for variant, env, finals in (("x", "A-v0", [1, 2, 3]), ("y", "A-v0", [4, 5, 6]),
                                 ("z", "B-v0", [7, 8, 9])):  # fmt: skip
        for k, final in enumerate(finals):
            write_evaluations(exp / f"{variant}{k}", [1000], [float(final)], env=env)
            plan.append({"name": f"{variant}{k}", "variant": variant, "values": {}, "seed": k,
                         "algo": "ppo"})  # fmt: skip
    (exp / "experiment.json").write_text(json.dumps({"name": "e", "runs": plan}))
    pairs = {(r["x"], r["y"]): r["p_x_better"] for r in report(exp, plots=False)["improvement"]}
    assert pairs == {("x", "y"): 0.0, ("y", "x"): 1.0}
