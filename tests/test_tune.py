"""``shoal tune``: the search space's distributions and their errors, Optuna finding a known
optimum on a toy objective, resuming its SQLite study, pruning, the best config as a tuned
example, and a real (tiny) PPO search from the command line."""

import contextlib
import math
import os
import signal

import numpy as np
import pytest

from shoal.cli import main
from shoal.core.errors import ConfigError
from shoal.registry import find_tuned
from shoal.studies.tune import Tuner, parse_distribution, train_objective, trial_line

BASE = {"name": "toy", "base": "ppo-cartpole", "seed": 0}

pytestmark = pytest.mark.extra("tune")


def toy(config, report):
    """Best at lr = 3e-3 (value 0), worse the further away in log scale."""
    _, data = config
    return -((math.log10(data["optim"]["lr"]) - math.log10(3e-3)) ** 2)


def test_distributions_and_their_errors():
    assert parse_distribution("x", "loguniform(1e-5, 1e-2)") == ("loguniform", (1e-5, 1e-2))
    assert parse_distribution("x", "int(1, 20)") == ("int", (1, 20))
    assert parse_distribution("x", "choice([64, 64], [256, 256])") == (
        "choice", ([64, 64], [256, 256]))  # fmt: skip
    for bad, message in [("normal(0, 1)", "not a distribution"), ("uniform(2, 1)", "low < high"),
                         ("loguniform(0, 1)", "low > 0"), ("int(1.5, 3)", "whole numbers"),
                         ("uniform(1)", "two numbers"), ("choice()", "at least one")]:  # fmt: skip
        with pytest.raises(ConfigError, match=message):
            parse_distribution("x", bad)
    with pytest.raises(ConfigError, match="did you mean lr"):
        Tuner({**BASE, "search": {"optim.lrr": "uniform(0.1, 0.2)"}})
    with pytest.raises(ConfigError, match="no search space"):
        Tuner(BASE)


def test_finds_a_known_optimum_and_resumes_its_study(tmp_path):
    spec = {**BASE, "search": {"optim.lr": "loguniform(1e-5, 1e-1)"}, "trials": 30}
    tuner = Tuner(spec, tmp_path / "study")
    study = tuner.run(toy)
    best = study.best_trial.user_attrs["values"]["optim.lr"]
    assert abs(math.log10(best) - math.log10(3e-3)) < 0.25  # within a factor of 1.8
    first = [t.params for t in study.trials]
    more = Tuner({**spec, "trials": 40}, tmp_path / "study").run(toy)  # the same SQLite study
    assert len(more.trials) == 40 and [t.params for t in more.trials[:30]] == first


def test_pruning_stops_trials_below_the_median(tmp_path):
    def curve(config, report):
        lr = config[1]["optim"]["lr"]
        for step in range(1, 11):
            if report(step * 1000, -abs(math.log10(lr) + 2.5) * step):
                return -abs(math.log10(lr) + 2.5) * step
        return -abs(math.log10(lr) + 2.5) * 10

    spec = {**BASE, "search": {"optim.lr": "loguniform(1e-5, 1e-1)"}, "trials": 20,
            "sampler": "random", "config": {"run": {"total_steps": 10_000}}}  # fmt: skip
    study = Tuner(spec, tmp_path / "s").run(curve)
    states = [t.state.name for t in study.trials]
    assert "PRUNED" in states and "COMPLETE" in states
    assert all(t.state.name == "COMPLETE" for t in study.trials[:5])  # the start-up trials
    for trial in study.trials:  # never on the first third of a trial's steps
        assert trial.state.name != "PRUNED" or max(trial.intermediate_values) > 10_000 // 3
    for trial in study.trials:  # its printed line says where it was pruned
        if trial.state.name == "PRUNED":
            step = trial.user_attrs["pruned_at"]
            assert step == max(trial.intermediate_values)
            assert trial_line(trial).startswith(f"trial {trial.number}: pruned at step {step:,}; ")


def test_a_ppo_search_writes_a_ready_tuned_example(tmp_path, capsys):
    file = tmp_path / "search.yaml"
    file.write_text(
        "name: cp\nbase: ppo-cartpole\n"
        "config: {run: {total_steps: 4096, eval_every_steps: 2048, eval_episodes: 3,"
        " target_return: null}, env: {num_envs: 16}, minibatch_size: 256}\n"
        "search: {optim.lr: 'loguniform(1e-4, 1e-2)', model.hidden: 'choice([16], [32])'}\n"
        "trials: 3\n"
    )
    assert main(["tune", str(file), "--dir", str(tmp_path / "study")]) == 0
    out = capsys.readouterr().out
    assert "3 trials; best: trial" in out and "algo: ppo" in out
    example = find_tuned(str(tmp_path / "study" / "best.yaml"))
    config = example.build_config()
    assert config.env.id == "CartPole-v1" and config.model.hidden in ((16,), (32,))
    assert 1e-4 <= config.optim.lr <= 1e-2 and np.isfinite(config.optim.lr)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_signal_fails_the_trial_instead_of_scoring_a_cut_short_run(tmp_path, signum):
    """Ctrl-C or SIGTERM mid-trial saves the trial's run and stops the search; the trial is
    not scored with the evaluation its cut-short run last made."""
    search = {**BASE, "config": {"run": {"total_steps": 8192, "eval_every_steps": 512,
              "eval_episodes": 2, "target_return": None}, "env": {"num_envs": 4},
              "num_steps": 64, "minibatch_size": 128, "model": {"hidden": [8]}},
              "search": {"optim.lr": "loguniform(1e-4, 1e-2)"}, "trials": 2}  # fmt: skip
    tuner = Tuner(search, tmp_path / "study")

    def stop_at_first_evaluation(config, report):
        def signal_then_report(step, value):
            os.kill(os.getpid(), signum)  # as a user's Ctrl-C or a scheduler's SIGTERM
            return report(step, value)

        return train_objective(config, signal_then_report)

    previous = signal.signal(signum, lambda *_: pytest.fail("shoal installed no handler"))
    try:
        with pytest.raises(KeyboardInterrupt):
            tuner.run(stop_at_first_evaluation)
    finally:
        signal.signal(signum, previous)
    (trial,) = tuner.study(0).get_trials()
    assert trial.state.name == "FAIL" and trial.value is None
    assert (tmp_path / "study" / "trial-0" / "checkpoints" / "latest").exists()  # saved


def test_sigterm_to_a_search_reaches_its_worker_processes(tmp_path):
    """SIGTERM to a search with worker processes (a scheduler's notice, `kill PID`) is passed
    on to them: each saves its trial's run, its trial fails, and none is left running."""
    import json
    import subprocess
    import sys
    import time

    spec = {**BASE, "config": {"run": {"total_steps": 10**8, "eval_every_steps": 512,
            "checkpoint_every_steps": 512, "eval_episodes": 2, "target_return": None},
            "env": {"num_envs": 4}, "num_steps": 64, "minibatch_size": 128,
            "model": {"hidden": [8]}}, "search": {"optim.lr": "loguniform(1e-4, 1e-2)"},
            "trials": 4, "sampler": "random", "pruner": "none"}  # fmt: skip
    directory = tmp_path / "study"
    code = (
        "import json, sys; from shoal.studies.tune import tune; "
        "tune(json.loads(sys.argv[1]), sys.argv[2], jobs=2)"
    )
    search = subprocess.Popen([sys.executable, "-c", code, json.dumps(spec), str(directory)],
                              start_new_session=True)  # fmt: skip
    saved = [directory / f"trial-{i}" / "checkpoints" / "latest" for i in (0, 1)]
    deadline = time.time() + 240
    while time.time() < deadline and not all(path.exists() for path in saved):
        time.sleep(0.2)
    search.send_signal(signal.SIGTERM)  # to the search's own process alone
    try:
        assert search.wait(timeout=120) != 0
    finally:
        with contextlib.suppress(ProcessLookupError):  # what is left, should the test fail
            os.killpg(search.pid, signal.SIGKILL)
    trials = Tuner(spec, directory).study().get_trials()
    assert sorted(t.state.name for t in trials) == ["FAIL", "FAIL"]  # none running, none scored
    assert all(path.exists() for path in saved)


def test_workers_as_ray_tasks_share_one_study(ray_session, tmp_path):
    """``--ray-address``: the workers are Ray tasks (here the tests' local Ray; on a cluster,
    any node) running trials against one study, which a later local run resumes."""
    from shoal.studies.tune import tune

    spec = {**BASE, "search": {"optim.lr": "loguniform(1e-5, 1e-1)"}, "trials": 12}
    tuner = tune(spec, tmp_path / "study", jobs=2, ray_address="local", objective=toy)
    study = tuner.study()
    assert len(study.trials) == 12 and (tmp_path / "study" / "best.yaml").exists()
    workers = {t.user_attrs["worker"] for t in study.trials}
    assert len(workers) == 2 and not any(w.endswith(f":{os.getpid()}") for w in workers)
    more = tune({**spec, "trials": 14}, tmp_path / "study", objective=toy).study()
    assert len(more.trials) == 14


def test_worker_processes_run_exactly_the_trials_asked_for(tmp_path):
    from shoal.studies.tune import tune

    spec = {**BASE, "search": {"optim.lr": "loguniform(1e-5, 1e-1)"}, "trials": 7}
    study = tune(spec, tmp_path / "study", jobs=2, objective=toy).study()
    assert len(study.trials) == 7 and len({t.user_attrs["worker"] for t in study.trials}) == 2


def test_a_sampled_invalid_config_fails_its_trial_and_the_search_goes_on(tmp_path):
    """num_steps 8 with 128 envs is a 1,024-step rollout, too short for a 4,096 minibatch:
    each value is valid with some other, so the space is accepted; the trials that draw the
    bad pair fail and the others run."""
    search = {"num_steps": "choice(8, 32)", "minibatch_size": "choice(1024, 4096)"}
    spec = {**BASE, "search": search, "trials": 12, "sampler": "random"}
    study = Tuner(spec, tmp_path / "s").run(lambda config, report: 1.0)
    states = {t.state.name for t in study.trials}
    assert states == {"FAIL", "COMPLETE"}
    for trial in study.trials:
        bad = trial.params["num_steps"] == 0 and trial.params["minibatch_size"] == 1
        assert (trial.state.name == "FAIL") == bad
    with pytest.raises(ConfigError, match="minibatch_size"):  # valid with no searched value
        Tuner({**BASE, "search": {"num_steps": "choice(8, 16)", "minibatch_size": "choice(4096)"}})


@pytest.mark.parametrize("sampler", ["tpe", "random"])
def test_parallel_workers_never_propose_the_same_trial(sampler, tmp_path):
    """Two workers that seeded their samplers alike proposed the same trials in pairs."""
    from shoal.studies.tune import tune

    search = {"optim.lr": "loguniform(1e-5, 1e-1)", "gamma": "uniform(0.9, 0.999)"}
    spec = {**BASE, "search": search, "trials": 8, "sampler": sampler}
    study = tune(spec, tmp_path / "study", jobs=2, objective=toy).study()
    params = [tuple(sorted(t.params.items())) for t in study.trials]
    assert len(params) == 8 and len(set(params)) == 8
    assert len({t.user_attrs["worker"] for t in study.trials}) == 2


def test_a_repeated_combination_takes_the_earlier_result_and_each_trial_is_printed(tmp_path):
    """On a 2-value space 6 trials must repeat: each value trains once, the repeats take its
    result (every trial trains with the same seed), and each trial prints one line."""
    trained, lines = [], []

    def objective(config, report):
        trained.append(config[1]["model"]["hidden"])
        if config[1]["model"]["hidden"] == [16] and report(10_000, -1.0):
            return -1.0
        return 1.0

    spec = {**BASE, "search": {"model.hidden": "choice([16], [32])"}, "trials": 6,
            "sampler": "random", "pruner": "none"}  # fmt: skip
    study = Tuner(spec, tmp_path / "s").run(objective, echo=lines.append)
    assert sorted(map(tuple, trained)) == [(16,), (32,)]
    assert len(lines) == 6 and all(line.startswith(f"trial {i}: ") for i, line in enumerate(lines))
    for trial, line in zip(study.trials, lines, strict=True):
        first = [t for t in study.trials if t.params == trial.params][0]
        assert trial.value == first.value == 1.0
        assert ("repeats trial" in line) == (trial.number != first.number)
        assert "value 1.00" in line and "model.hidden=[" in line


def test_a_search_killed_mid_trial_finishes_on_restart_with_no_trial_left_running(tmp_path):
    """kill -9 the search while a trial trains; started again, it marks that trial failed
    (its worker is gone) and runs on to the trials asked for, none left running."""
    import json
    import signal
    import subprocess
    import sys
    import time

    import optuna

    from shoal.studies.tune import tune

    spec = {**BASE, "search": {"optim.lr": "loguniform(1e-4, 1e-2)"}, "trials": 5,
            "sampler": "random", "pruner": "none"}  # fmt: skip
    directory = tmp_path / "study"
    started = tmp_path / "started"
    code = (  # the first trial finishes; the second never does, so the kill lands inside it
        "import json, sys, time\nfrom shoal.studies.tune import tune\n"
        "def slow(config, report):\n"
        f"    with open({str(started)!r}, 'a') as f:\n        f.write('x')\n"
        f"    if len(open({str(started)!r}).read()) > 1:\n        time.sleep(3600)\n"
        "    return 1.0\n"
        "tune(json.loads(sys.argv[1]), sys.argv[2], objective=slow)\n"
    )
    search = subprocess.Popen([sys.executable, "-c", code, json.dumps(spec), str(directory)])
    # wait on the marker file, not the database: reading a study while the search creates it
    # races its schema creation
    deadline = time.time() + 240
    while time.time() < deadline and search.poll() is None:
        if started.exists() and len(started.read_text()) >= 2:  # the second trial began
            break
        time.sleep(0.1)
    assert search.poll() is None, "the search ended before its second trial"
    search.send_signal(signal.SIGKILL)
    search.wait()
    killed = optuna.load_study(study_name="toy", storage=f"sqlite:///{directory / 'study.db'}")
    assert any(t.state.name == "COMPLETE" for t in killed.trials)
    orphans = [t.number for t in killed.trials if t.state.name == "RUNNING"]
    assert orphans  # the trial the kill cut short
    study = tune(spec, directory, objective=toy).study()
    states = [t.state.name for t in study.trials]
    assert "RUNNING" not in states and states.count("COMPLETE") == 5
    assert all(study.trials[n].state.name == "FAIL" for n in orphans)
