"""One training run's named steps, which `shoal.train.loop.run` takes top to bottom: start (or
resume), iterate, evaluate, checkpoint, the stop conditions, finish.

A `Session` holds what the steps share: the algorithm, the evaluation envs, the loggers, the
callbacks and the loop's own counters (`LoopState`, saved with every checkpoint so that a
resumed run keeps its cadence). The loop knows one progress counter, the algorithm's
``env_steps`` (see `shoal.core.interfaces.Algorithm`): ``run.total_steps``, the evaluation and the
checkpoint cadences count it, whether an iteration steps a vector env, evaluates a population
or passes over a dataset.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from shoal.collect.evaluate import evaluate, evaluate_joint
from shoal.config import from_dict, to_dict
from shoal.core.interfaces import ActsJointly, AlgorithmSpec, ExtraEvaluation, OwnSpaces
from shoal.core.seeding import derive_seed, rng_state, seed_torch, set_rng_state
from shoal.core.threads import set_compute_threads
from shoal.envs import make_env
from shoal.envs.make import make_multi_agent_env
from shoal.nn.policy import JointPolicy
from shoal.train.callbacks import Callbacks, TrainContext
from shoal.train.checkpoint import (
    Checkpoint,
    RunState,
    config_changes,
    incompatible,
    save_checkpoint,
)
from shoal.train.logger import MultiLogger, make_loggers
from shoal.train.run_dir import guarded_write, record_for_deploy, resolve_run_dir
from shoal.train.signals import SIGNAL_WORDS
from shoal.train.trackers import make_trackers


@dataclass
class LoopState:
    """The loop's own counters, saved with checkpoints so a resumed run keeps its cadence."""

    next_eval: int = 0
    next_checkpoint: int = 0
    evaluations: int = 0
    eval_return: float | None = None
    train_s: float = 0.0
    eval_step: int | None = None
    eval_scores: dict[str, float] | None = None
    """The last evaluation the algorithm made itself (AlphaZero's and MuZero's matches against
    fixed players): its ``eval/*`` metrics, with the env step as ``"step"``."""


@dataclass(frozen=True)
class RunResult:
    run_dir: Path
    checkpoint: Path | None
    """The last checkpoint written (None only if none could be written)."""
    env_steps: int
    iterations: int
    wall_s: float
    """Seconds from building the algorithm to the end, evaluation included."""
    setup_s: float
    """Seconds spent building the algorithm (environments and networks)."""
    train_s: float
    """Seconds spent in training iterations only (no evaluation, no checkpointing)."""
    eval_return: float | None
    """Mean return of the last evaluation (None when evaluation is off)."""
    stop_reason: str
    """total_steps, target_return, max_wall_s, interrupted (Ctrl-C), terminated (SIGTERM) or
    callback."""
    eval_step: int | None = None
    """The env step at which ``eval_return`` was measured: the end of the run, unless the
    run was interrupted or evaluates only at its ``run.eval_every_steps``."""
    session_train_s: float | None = None
    """Seconds of training in this process (``train_s`` counts the whole run, across
    resumes)."""
    resumed_from: int | None = None
    """The checkpoint's env step when this process resumed a run."""
    stop_detail: str = ""
    """Which condition ended the run, in words."""
    unit: str = "env step"
    """What ``env_steps`` counts, a singular noun: "env step", or "update" for an offline
    learner (`shoal.algos.spec.AlgorithmSpec.counts`)."""
    eval_scores: dict[str, float] | None = None
    """The last evaluation the algorithm made itself, where it evaluates by matches
    (AlphaZero, MuZero on games): its ``eval/*`` metrics and ``"step"``, its env step."""

    @property
    def solved(self) -> bool:
        return self.stop_reason == "target_return"


class Session:
    """A run between its start and its end; build it with `Session.start`."""

    spec: AlgorithmSpec
    config: Any
    hooks: Callbacks
    loop: LoopState
    run_dir: Path
    algorithm: Any
    eval_env: Any
    loggers: MultiLogger
    deploy_meta: dict[str, Any]
    config_json: dict[str, Any]
    checkpoint: Path | None
    """The last checkpoint written (a resumed run's own until it writes one)."""
    resumed_from: int | None
    """The checkpoint's env step when this process resumed a run."""
    exact: bool
    """False when a resume could not restore the envs mid-episode (`start` says so)."""
    replay_lost: bool
    """True when a resumed run's replay was not saved (``replay.save`` off)."""
    stop_asked: bool
    """A callback asked to stop after the last iteration."""
    started: float
    setup_s: float
    train_s_before: float
    unit: str
    """What the run's progress counts (`RunResult.unit`)."""

    # --- start or resume ------------------------------------------------------------------

    @classmethod
    def start(
        cls, spec: AlgorithmSpec, config: Any, resume: Checkpoint | None, hooks: Callbacks
    ) -> Session:
        """Create (or reopen) the run directory, build the algorithm, restore it from
        ``resume``, open the loggers and start the callbacks. A start that fails (unknown
        env, unwritable files, ...) closes what it built and leaves no empty run behind."""
        self = cls()
        self.spec, self.hooks, self.checkpoint, self.stop_asked = spec, hooks, None, False
        self.loop = LoopState(
            next_eval=config.run.eval_every_steps, next_checkpoint=config.run.checkpoint_every_steps
        )
        self.resumed_from, self.exact, self.replay_lost = None, True, False
        if resume is not None:
            try:
                self.loop = LoopState(**resume.run_state.loop)
            except (KeyError, TypeError) as exc:
                raise incompatible(resume.path, exc) from exc
            self.resumed_from, self.checkpoint = resume.env_steps, resume.path
            config = _drop_reached_target(config, resume, self.loop)
            _reschedule(self.loop, resume.setting("run", {}), config.run, self.resumed_from)
        self.config = config
        self.unit = spec.unit(config)
        self.train_s_before = self.loop.train_s
        set_compute_threads(config.run.torch_threads)
        self.run_dir, created = resolve_run_dir(spec, config, resume)
        self.algorithm = self.eval_env = None
        try:
            self._build(resume)
        except BaseException:
            self.close()
            if created is not None:
                shutil.rmtree(created, ignore_errors=True)
            raise
        self._say_how_it_resumed()
        return self

    def _build(self, resume: Checkpoint | None) -> None:
        config, run_cfg = self.config, self.config.run
        self.config_json = to_dict(config)  # what every checkpoint records
        config_text = json.dumps(self.config_json, indent=2)
        seed_torch(run_cfg.seed)  # before building: network init draws from the torch generator
        self.started = time.perf_counter()
        self.algorithm = self.spec.algorithm_cls(config)
        self.setup_s = time.perf_counter() - self.started
        if resume is not None:
            try:
                saved = resume.run_state
                self.exact = bool(self.algorithm.load_state_dict(saved.algorithm))
                self.replay_lost = resume.replay_dropped
                set_rng_state(saved.rng)
            except (KeyError, RuntimeError, TypeError, ValueError) as exc:
                raise incompatible(resume.path, exc, self._changes_from(resume)) from exc
        # Written once the run is built (and restored): a resume that fails leaves the run's
        # config as it was.
        guarded_write(lambda: (self.run_dir / "config.json").write_text(config_text))
        # What the spec declares the algorithm has (`shoal.algos.spec.AlgorithmSpec`).
        joint = self.spec.acts_jointly and cast(ActsJointly, self.algorithm).joint
        spaces = cast(OwnSpaces, self.algorithm).deploy_spaces if self.spec.own_spaces else None
        self.eval_env = make_eval_env(config, joint)
        self.deploy_meta = record_for_deploy(config, self.eval_env, joint, spaces)
        self.loggers = guarded_write(
            lambda: make_loggers(
                self.run_dir,
                run_cfg.total_steps,
                run_cfg.console,
                run_cfg.tensorboard,
                resume_step=self.resumed_from,
                trackers=make_trackers(
                    self.run_dir, json.loads(config_text), run_cfg.wandb, run_cfg.mlflow
                ),
                groups=list(getattr(self.eval_env, "groups", {}) or {}) if joint else (),
                unit=self.unit,
            )
        )
        if resume is not None:
            self.hooks.load_state_dict(resume.run_state.callbacks)
        context = TrainContext(config, self.run_dir, self.algorithm, self.save, self.resumed_from)
        self.hooks.start(context)

    def _changes_from(self, resume: Checkpoint) -> list[str]:
        """The env and model fields this resume changes from the checkpoint's config (read
        with today's field names)."""
        try:
            saved = to_dict(from_dict(type(self.config), resume.config))
        except Exception:  # a config this shoal cannot read: nothing to compare
            return []
        return config_changes(saved, self.config_json)

    def _say_how_it_resumed(self) -> None:
        if self.resumed_from is None:
            return
        lost = self.loggers.lost_steps
        print(
            f"resumed from step {self.resumed_from:,}"
            + (f" ({lost:,} steps since the last checkpoint were lost)" if lost else "")
        )
        inexact: list[str] = []
        if not self.exact:
            inexact.append(
                f"the episodes of {self.config.env.id} could not be restored mid-episode, so "
                "they restart from fresh resets"
            )
        if self.replay_lost:
            inexact.append(
                "the replay buffer was not saved (replay.save is off), so it refills from the "
                "restored policy"
            )
        if inexact:
            print(f"note: this resume is not exact: {'; '.join(inexact)}; the weights, optimizer "
                  "and counters are restored")  # fmt: skip

    # --- one iteration --------------------------------------------------------------------

    @property
    def steps(self) -> int:
        return self.algorithm.env_steps

    def iterate(self) -> None:
        """One training iteration, timed and logged, then an evaluation when one is due; the
        callbacks see both and may ask to stop (`stop_asked`)."""
        before, started = self.steps, time.perf_counter()
        metrics = self.algorithm.train_iteration()
        elapsed = time.perf_counter() - started
        own = eval_part(metrics)  # an evaluation the algorithm made itself (matches)
        if own:
            self.loop.eval_scores = {**own, "step": self.steps}
        self.loop.train_s += elapsed
        metrics["perf/env_steps_per_s"] = (self.steps - before) / elapsed
        metrics["perf/iteration_s"] = elapsed
        run_cfg, loop = self.config.run, self.loop
        if self.eval_env is not None and self.steps >= loop.next_eval:
            metrics.update(self.evaluate(derive_seed(run_cfg.seed, "eval", loop.evaluations)))
            loop.evaluations += 1
            loop.next_eval = next_multiple(self.steps, run_cfg.eval_every_steps)
        self.loggers.log(metrics, self.steps)
        asked = self.hooks.call("on_iteration", metrics)
        if "eval/return" in metrics:
            asked |= self.hooks.call("on_evaluation", eval_part(metrics))
        self.stop_asked = asked

    # --- evaluate -------------------------------------------------------------------------

    def evaluate(self, seed: int) -> dict[str, float]:
        """Evaluate the current policy on the evaluation envs, with the actions
        ``run.eval_actions`` names."""
        policy = self.algorithm.policy()
        deterministic = self.config.run.eval_actions == "deterministic"
        if isinstance(policy, JointPolicy):
            metrics = evaluate_joint(policy, self.eval_env, seed, deterministic)
        else:
            metrics = evaluate(policy, self.eval_env, seed, deterministic)
        if self.spec.extra_evaluation:  # e.g. an offline learner's normalized score
            metrics.update(cast(ExtraEvaluation, self.algorithm).eval_metrics(metrics))
        self.loop.eval_return, self.loop.eval_step = metrics["eval/return"], self.steps
        return metrics

    # --- checkpoint -----------------------------------------------------------------------

    @property
    def checkpoint_due(self) -> bool:
        """``run.checkpoint_every_steps`` says a checkpoint is due at this step."""
        every = self.config.run.checkpoint_every_steps
        return bool(every) and self.steps >= self.loop.next_checkpoint

    def checkpoint_when_due(self) -> None:
        if self.checkpoint_due:
            self.save()

    def save(self, notify: bool = True) -> Path:
        """Write a checkpoint of the whole run (algorithm, RNGs, the loop's counters, the
        callbacks' state), after flushing the logs so they reach at least as far. A save at a
        step where one was due also moves the cadence on (the run's last save included)."""
        if self.checkpoint_due:
            every = self.config.run.checkpoint_every_steps
            self.loop.next_checkpoint = next_multiple(self.steps, every)
        guarded_write(self.loggers.flush)
        state = RunState(
            algorithm=self.algorithm.state_dict(),
            rng=rng_state(),
            loop=dataclasses.asdict(self.loop),
            callbacks=self.hooks.state_dict(),
        )
        run_cfg = self.config.run
        self.checkpoint = guarded_write(
            lambda: save_checkpoint(
                self.run_dir,
                self.steps,
                self.spec.name,
                self.config_json,
                state,
                run_cfg.keep_checkpoints,
                self.deploy_meta,
            )
        )
        if notify:
            self.hooks.call("on_checkpoint", self.checkpoint)
        return self.checkpoint

    # --- when to stop ---------------------------------------------------------------------

    def stop_reason(self, signalled: Sequence[str]) -> str | None:
        """Why the run stops now, if it does: every stop condition, in order of precedence.
        ``signalled`` holds the stop reason of a Ctrl-C or SIGTERM the process received."""
        run_cfg, loop = self.config.run, self.loop
        target = run_cfg.target_return
        if target is not None and loop.eval_return is not None and loop.eval_return >= target:
            return "target_return"
        if (
            run_cfg.max_wall_s is not None
            and time.perf_counter() - self.started > run_cfg.max_wall_s
        ):
            return "max_wall_s"
        if signalled:
            return signalled[0]
        if self.stop_asked:
            return "callback"
        if self.steps >= run_cfg.total_steps:
            return "total_steps"
        return None

    def stop_detail(self, reason: str) -> str:
        """Which condition ended the run, in words."""
        run_cfg, loop, steps, unit = self.config.run, self.loop, self.steps, self.unit
        if reason == "target_return":
            return (
                f"the eval return {loop.eval_return:.1f} reached run.target_return "
                f"{run_cfg.target_return:g} at {unit} {loop.eval_step:,}"
            )
        if reason == "max_wall_s":
            return f"run.max_wall_s ({run_cfg.max_wall_s:g} s) elapsed at {unit} {steps:,}"
        if reason in SIGNAL_WORDS:
            word = SIGNAL_WORDS[reason]
            return f"{reason} ({word}) at {unit} {steps:,}; continue with --resume"
        if reason == "callback":
            return f"{self.hooks.stop_reason} at {unit} {steps:,}"
        return f"run.total_steps {run_cfg.total_steps:,} reached ({steps:,} {unit}s)"

    # --- finish ---------------------------------------------------------------------------

    def finish(self, reason: str) -> None:
        """The end of a run: a final evaluation of the policy unless the last one saw it (or
        the user interrupted), the last checkpoint, the trackers' artifacts. The final
        evaluation's seeds are its own, and the periodic evaluations' count stays, so a run
        stopped here and resumed evaluates exactly as one that never stopped."""
        if (
            self.eval_env is not None
            and reason not in SIGNAL_WORDS
            and self.loop.eval_step != self.steps
        ):
            seed = derive_seed(self.config.run.seed, "final-eval", self.steps)
            final = self.evaluate(seed)
            self.loggers.log({**final, "eval/final": 1}, self.steps)  # its own row, marked
            self.hooks.call("on_evaluation", eval_part(final))
        self.save()
        self.loggers.artifacts(self.run_dir / "config.json", self.checkpoint)

    def result(self, reason: str) -> RunResult:
        """What the run did, for the caller and the callbacks' ``on_train_end``."""
        loop = self.loop
        return RunResult(
            run_dir=self.run_dir,
            checkpoint=self.checkpoint,
            env_steps=self.steps,
            iterations=self.algorithm.iteration,
            wall_s=time.perf_counter() - self.started,
            setup_s=self.setup_s,
            train_s=loop.train_s,
            eval_return=loop.eval_return,
            stop_reason=reason,
            eval_step=loop.eval_step,
            session_train_s=loop.train_s - self.train_s_before,
            resumed_from=self.resumed_from,
            stop_detail=self.stop_detail(reason),
            unit=self.unit,
            eval_scores=loop.eval_scores,
        )

    def close(self) -> None:
        """Close the loggers, the algorithm and the evaluation envs (whatever was built)."""
        if getattr(self, "loggers", None) is not None:
            self.loggers.close()
        if self.algorithm is not None:
            self.algorithm.close()
        if self.eval_env is not None:
            self.eval_env.close()


def make_eval_env(config: Any, joint: bool = False):
    """The evaluation envs: one per evaluation episode; a multi-agent env itself when the
    policies of several groups act together (``joint``). None when the run never evaluates."""
    run_cfg = config.run
    if run_cfg.eval_every_steps == 0 and run_cfg.target_return is None:
        return None
    # Raw observations: the deployed policy applies the frozen training statistics itself.
    # Whole Atari games with true rewards: no episodic life, no reward clipping.
    env_config = dataclasses.replace(
        config.env,
        num_envs=run_cfg.eval_episodes,
        normalize_obs=False,
        normalize_reward=False,
        atari_training=False,
    )
    return make_multi_agent_env(env_config) if joint else make_env(env_config)


def _drop_reached_target(config: Any, resume: Checkpoint, loop: LoopState) -> Any:
    """Resuming a run with a ``run.total_steps`` of its own (not the run's), beyond the
    checkpoint, means "train for longer": a ``run.target_return`` the run has already
    reached would stop it after one iteration, so it is dropped, with a note. A higher
    target, not yet reached, is kept; a plain resume of a run that reached its target keeps
    it, and stops at once."""
    target = config.run.target_return
    if target is None or loop.eval_return is None or loop.eval_return < target:
        return config
    saved_total = int(resume.setting("run.total_steps", 0))
    given = config.run.total_steps != saved_total  # a total named on the resume
    if not given or config.run.total_steps <= resume.env_steps:
        print(
            f"note: the run had reached its target_return {target:g} (eval return "
            f"{loop.eval_return:.1f}): nothing to train (raise --run.total-steps to train on)"
        )
        return config
    print(
        f"note: the run had reached its target_return {target:g} (eval return "
        f"{loop.eval_return:.1f}); training on to run.total_steps {config.run.total_steps:,} "
        "without a target (set a higher --run.target-return to stop at one)"
    )
    return dataclasses.replace(config, run=dataclasses.replace(config.run, target_return=None))


def _reschedule(loop: LoopState, saved: dict[str, Any], run_cfg: Any, steps: int) -> None:
    """A resume under another evaluation or checkpoint cadence than the checkpoint's (a
    changed ``run.eval_every_steps``, a ``run.target_return`` added or removed, a changed
    ``run.checkpoint_every_steps``) takes the new cadence from the step it resumes at; an
    unchanged one keeps the saved counters, so a plain resume continues exactly."""
    before = (saved.get("eval_every_steps"), saved.get("target_return") is None)
    if before != (run_cfg.eval_every_steps, run_cfg.target_return is None):
        loop.next_eval = next_multiple(steps, run_cfg.eval_every_steps)
    if saved.get("checkpoint_every_steps") != run_cfg.checkpoint_every_steps:
        loop.next_checkpoint = next_multiple(steps, run_cfg.checkpoint_every_steps)


def eval_part(metrics: dict[str, float]) -> dict[str, float]:
    """The evaluation's metrics among an iteration's."""
    return {k: v for k, v in metrics.items() if k.startswith("eval/") and k != "eval/final"}


def next_multiple(steps: int, every: int) -> int:
    """The first multiple of ``every`` after ``steps`` (every iteration when ``every`` is 0)."""
    return (steps // every + 1) * every if every else steps + 1
