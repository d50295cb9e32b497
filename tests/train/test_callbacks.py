"""Training callbacks (`shoal.train.callbacks`): events and their order, stopping, the
built-ins, errors, names in configs, and `set_env_attr` reaching the envs."""

import json

import numpy as np
import pytest

import shoal
from shoal.core.errors import ConfigError
from shoal.train.callbacks import Callback, CallbackError, EarlyStopping
from shoal.train.checkpoint import load_checkpoint

QUIET = {
    "run.console": False,
    "run.tensorboard": False,
    "env.num_envs": 4,
    "num_steps": 16,
    "minibatch_size": 32,
    "model.hidden": (16,),
}
ITERATION = 64  # env steps per iteration with QUIET


LEVEL_ENV = "level_env:LevelEnv-v0"  # tests/level_env.py


class Recorder(Callback):
    def __init__(self):
        self.events = []

    def on_train_start(self, context):
        self.events.append(("start", context.env_steps))

    def on_iteration(self, metrics):
        self.events.append(("iteration", self.context.env_steps))

    def on_evaluation(self, result):
        self.events.append(("evaluation", self.context.env_steps, result["eval/return"]))

    def on_checkpoint(self, path):
        self.events.append(("checkpoint", load_checkpoint(path).meta["env_steps"]))

    def on_train_end(self, result):
        self.events.append(("end", result.env_steps))


def test_every_event_fires_in_order(tmp_path):
    recorder = Recorder()
    result = shoal.train(
        "ppo",
        total_steps=4 * ITERATION,
        run_dir=str(tmp_path / "run"),
        callbacks=[recorder],
        **{
            **QUIET,
            "run.eval_every_steps": 2 * ITERATION,
            "run.eval_episodes": 2,
            "run.checkpoint_every_steps": 2 * ITERATION,
        },
    )
    kinds = [e[0] for e in recorder.events]
    returns = {e[1]: e[2] for e in recorder.events if e[0] == "evaluation"}
    assert kinds == [
        "start",
        "iteration",
        "iteration", "evaluation", "checkpoint",
        "iteration",
        "iteration", "evaluation",
        "checkpoint",  # due and final at once: written once, after the final evaluation
        "end",  # (which the last periodic evaluation made unnecessary: it saw this step)
    ]  # fmt: skip
    steps = [e[1] for e in recorder.events]
    assert steps == [0, 64, 128, 128, 128, 192, 256, 256, 256, 256]
    assert returns[256] == result.eval_return


def test_a_callback_evaluates_the_current_policy(tmp_path):
    """`TrainContext.policy` is the policy as it is at that iteration: a copy, whose actions
    equal those of the run's final policy after the last iteration."""

    class Snapshot(Callback):
        def on_iteration(self, metrics):
            self.policy = self.context.policy()

    snapshot = Snapshot()
    result = shoal.train("ppo", total_steps=2 * ITERATION, run_dir=str(tmp_path / "run"),
                         callbacks=[snapshot], **{**QUIET, "run.eval_every_steps": 0})  # fmt: skip
    obs = np.random.default_rng(0).normal(size=(16, 4)).astype(np.float32)
    final = shoal.load(result.run_dir)
    assert np.array_equal(snapshot.policy.act(obs), final.act(obs))


def test_a_callback_stops_the_run_cleanly(tmp_path):
    class StopAtTwo(Callback):
        stop_reason = "two iterations are enough"

        def on_iteration(self, metrics):
            return self.context.iteration >= 2

    result = shoal.train(
        "ppo",
        total_steps=10 * ITERATION,
        run_dir=str(tmp_path / "run"),
        callbacks=[StopAtTwo()],
        **{**QUIET, "run.eval_every_steps": 0},
    )
    assert result.stop_reason == "callback" and result.env_steps == 2 * ITERATION
    assert "StopAtTwo: two iterations are enough" in result.stop_detail
    assert load_checkpoint(result.run_dir).meta["env_steps"] == 2 * ITERATION  # saved


def test_early_stopping_stops_after_patience_evaluations_without_improvement(tmp_path):
    env_id = LEVEL_ENV  # the return never changes
    recorder = Recorder()
    result = shoal.train(
        "ppo",
        env=env_id,
        total_steps=50 * ITERATION,
        run_dir=str(tmp_path / "run"),
        callbacks=[EarlyStopping(patience=3), recorder],
        **{**QUIET, "run.eval_every_steps": ITERATION, "run.eval_episodes": 2},
    )
    evaluations = [e for e in recorder.events if e[0] == "evaluation"]
    assert len(evaluations) == 4  # the first sets the best, three more without improvement
    assert result.stop_reason == "callback" and result.env_steps == 4 * ITERATION
    assert "no improvement of eval/return in 3 evaluations" in result.stop_detail
    # Its state travels with the checkpoint.
    state = load_checkpoint(result.run_dir).state["callbacks"][0]
    assert state == {"best": 0.0, "since_best": 3}


def test_save_best_keeps_the_best_evaluation(tmp_path):
    recorder = Recorder()
    result = shoal.train(
        "ppo",
        total_steps=8 * ITERATION,
        seed=1,
        run_dir=str(tmp_path / "run"),
        callbacks=[recorder],
        **{
            **QUIET,
            "run.callbacks": ("SaveBest",),
            "run.eval_every_steps": ITERATION,
            "run.eval_episodes": 3,
            "optim.lr": 3e-3,
        },
    )
    evaluations = [(e[2], e[1]) for e in recorder.events if e[0] == "evaluation"]
    best_return, best_step = max(evaluations, key=lambda x: (x[0], -x[1]))  # first of the best
    info = json.loads((result.run_dir / "best" / "best.json").read_text())
    assert info == {"env_steps": best_step, "eval/return": best_return}
    assert load_checkpoint(result.run_dir / "best").meta["env_steps"] == best_step
    shoal.load(result.run_dir / "best").act(np.zeros(4, np.float32))
    assert len({r for r, _ in evaluations}) > 1  # the test saw the returns change


def test_a_raising_callback_loses_nothing(tmp_path):
    class Boom(Callback):
        def on_iteration(self, metrics):
            if self.context.iteration == 3:
                raise RuntimeError("my logger is down")

    run_dir = tmp_path / "run"
    with pytest.raises(CallbackError, match=r"Boom.on_iteration raised RuntimeError: my logger"):
        shoal.train(
            "ppo",
            total_steps=10 * ITERATION,
            run_dir=str(run_dir),
            callbacks=[Boom()],
            **{**QUIET, "run.eval_every_steps": 0, "run.checkpoint_every_steps": 0},
        )
    assert load_checkpoint(run_dir).meta["env_steps"] == 3 * ITERATION
    resumed = shoal.train(resume=run_dir, total_steps=5 * ITERATION)
    assert resumed.resumed_from == 3 * ITERATION and resumed.env_steps == 5 * ITERATION


def test_callbacks_by_name_in_yaml_and_bad_names(tmp_path):
    config = tmp_path / "exp.yaml"
    config.write_text(
        "algo: ppo\n"
        "callbacks: ['EarlyStopping(patience=2)', 'tests.train.test_callbacks:Recorder']\n"
        "config:\n  env: {id: CartPole-v1, num_envs: 4}\n  num_steps: 16\n"
        "  minibatch_size: 32\n  run: {console: false, tensorboard: false}\n"
    )
    result = shoal.train(tuned=str(config), total_steps=ITERATION, run_dir=str(tmp_path / "r"))
    saved = json.loads((result.run_dir / "config.json").read_text())
    assert saved["run"]["callbacks"] == [
        "EarlyStopping(patience=2)",
        "tests.train.test_callbacks:Recorder",
    ]
    for spec, message in [
        ("tests.train.nope:Cb", "cannot import module 'tests.train.nope'"),
        ("Nope", "no built-in callback 'Nope'"),
        ("EarlyStopping(patience=0)", "patience = 0 is invalid"),
        ("EarlyStopping(wait=3)", "unexpected keyword argument 'wait'"),
        ("builtins:object", "is not a callback class"),
    ]:
        run_dir = tmp_path / "bad"
        with pytest.raises(ConfigError, match=message):
            shoal.train("ppo", run_dir=str(run_dir), **{**QUIET, "run.callbacks": (spec,)})
        assert not run_dir.exists()  # refused before any run was made


class Curriculum(Callback):
    """Raise the env's level to 1 after the second iteration."""

    def on_iteration(self, metrics):
        if self.context.iteration == 2:
            self.context.set_env_attr("level", 1.0)


def train_with_curriculum(tmp_path, **extra):
    seen = []
    shoal.train(
        "ppo",
        env=LEVEL_ENV,
        total_steps=5 * ITERATION,
        run_dir=str(tmp_path / "run"),
        callbacks=[Curriculum()],
        on_iteration=lambda steps, metrics: seen.append(metrics.get("episode/return")),
        **{**QUIET, "run.eval_every_steps": 0, **extra},
    )
    assert seen[0] == 0.0 and seen[1] == 0.0
    assert seen[-1] == 4.0  # four steps of level 1 in every env's episodes


def test_set_env_attr_reaches_every_training_env(tmp_path):
    train_with_curriculum(tmp_path, **{"env.vectorization": "sync"})


def test_set_env_attr_reaches_ray_runners(tmp_path, ray_session):
    train_with_curriculum(tmp_path, **{"run.runners": 2, "env.num_envs": 2})


def test_set_env_attr_refuses_an_unknown_attribute(tmp_path):
    class Typo(Callback):
        def on_train_start(self, context):
            context.set_env_attr("levle", 1)

    with pytest.raises(CallbackError, match="no attribute 'levle'"):
        shoal.train("ppo", run_dir=str(tmp_path / "run"), callbacks=[Typo()], **QUIET)
