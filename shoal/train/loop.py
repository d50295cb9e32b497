"""The training loop: drives an algorithm, evaluates, logs, checkpoints and stops.

Algorithms only return metric dicts; this loop is the one place that logs them, decides when to
evaluate and checkpoint, and handles Ctrl-C (finish the iteration, save, exit) and NaN losses
(stop without saving the broken state, point at the last good checkpoint).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shoal.config import is_nested, to_dict
from shoal.device import check_precision, resolve_device
from shoal.envs import make_env
from shoal.envs.multi_agent import make_multi_agent_env
from shoal.errors import ConfigError, NaNLossError
from shoal.interfaces import Algorithm, AlgorithmSpec
from shoal.policy import JointPolicy
from shoal.seeding import derive_seed, rng_state, seed_torch, set_rng_state
from shoal.threads import set_compute_threads
from shoal.train.callbacks import CallbackError, Callbacks, TrainContext, build_callbacks
from shoal.train.checkpoint import Checkpoint, incompatible, save_checkpoint
from shoal.train.evaluate import evaluate, evaluate_joint
from shoal.train.logger import make_loggers
from shoal.train.run_dir import guarded_write, record_for_deploy, resolve_run_dir


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
    """total_steps, target_return, max_wall_s, interrupted or callback."""
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

    @property
    def solved(self) -> bool:
        return self.stop_reason == "target_return"


IterationCallback = Callable[[int, dict[str, float]], None]


def run(
    spec: AlgorithmSpec,
    config: Any,
    resume: Checkpoint | None = None,
    on_iteration: IterationCallback | None = None,
    callbacks: Sequence[Any] = (),
) -> RunResult:
    """Train ``config`` with ``spec``'s algorithm until a stop condition; see `RunResult`.
    ``callbacks`` (`shoal.train.callbacks`) run after those the config names
    (``run.callbacks``); ``on_iteration(steps, metrics)`` is the older one-function form."""
    check_runtime(spec, config)
    hooks = build_callbacks(config, callbacks, on_iteration)  # imports checked before any run
    loop = _LoopState(
        next_eval=config.run.eval_every_steps, next_checkpoint=config.run.checkpoint_every_steps
    )
    resumed_from = None
    if resume is not None:
        try:
            loop = _LoopState(**resume.state["loop"])
        except (KeyError, TypeError) as exc:
            raise incompatible(resume.path, exc) from exc
        resumed_from = int(resume.meta["env_steps"])
        config = _drop_reached_target(config, resume, loop)
    run_cfg = config.run
    set_compute_threads(run_cfg.torch_threads)
    run_dir, created = resolve_run_dir(spec, config, resume)
    config_json = to_dict(config)
    algorithm: Any = None
    eval_env = None

    def save(notify: bool = True) -> Path:
        guarded_write(loggers.flush)  # the logs on disk reach at least the checkpoint
        state = {
            "algorithm": algorithm.state_dict(),
            "rng": rng_state(),
            "loop": dataclasses.asdict(loop),
            "callbacks": hooks.state_dict(),
        }
        path = guarded_write(
            lambda: save_checkpoint(
                run_dir,
                algorithm.env_steps,
                spec.name,
                config_json,
                state,
                run_cfg.keep_checkpoints,
                deploy_meta,
            )
        )
        if notify:
            hooks.call("on_checkpoint", path)
        return path

    try:  # a start that fails (unknown env, unwritable files, ...) leaves no empty run behind
        config_text = json.dumps(config_json, indent=2)
        guarded_write(lambda: (run_dir / "config.json").write_text(config_text))
        seed_torch(run_cfg.seed)  # before building: network init draws from the torch generator
        start = time.perf_counter()
        algorithm = spec.algorithm_cls(config)
        setup_s = time.perf_counter() - start
        if resume is not None:
            try:
                exact = algorithm.load_state_dict(resume.state["algorithm"])
                set_rng_state(resume.state["rng"])
            except (KeyError, RuntimeError, TypeError, ValueError) as exc:
                raise incompatible(resume.path, exc) from exc
        joint = getattr(algorithm, "joint", False)  # several groups' policies act together
        eval_env = _make_eval_env(config, joint)
        deploy_meta = record_for_deploy(config, eval_env, joint)
        loggers = guarded_write(
            lambda: make_loggers(
                run_dir,
                run_cfg.total_steps,
                run_cfg.console,
                run_cfg.tensorboard,
                resume_step=resumed_from,
                wandb=run_cfg.wandb,
                mlflow=run_cfg.mlflow,
                config=json.loads((run_dir / "config.json").read_text())
                if (run_cfg.wandb or run_cfg.mlflow is not None)
                and (run_dir / "config.json").exists()
                else None,
            )
        )
        if resume is not None:
            hooks.load_state_dict(resume.state.get("callbacks"))
        hooks.start(TrainContext(config, run_dir, algorithm, save, resumed_from))
    except BaseException:
        if algorithm is not None:
            algorithm.close()
        if eval_env is not None:
            eval_env.close()
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        raise
    if resumed_from is not None:
        lost = loggers.lost_steps
        print(
            f"resumed from step {resumed_from:,}"
            + (f" ({lost:,} steps since the last checkpoint were lost)" if lost else "")
        )
    if resume is not None and not exact:
        print(
            "note: the run could not be restored exactly: the checkpoint lacks the state of "
            f"{config.env.id} mid-episode (episodes restart) or the replay buffer "
            "(save_replay is off); training continues from the saved weights"
        )

    checkpoint = resume.path if resume is not None else None
    stop_reason = "total_steps"
    train_s_before = loop.train_s
    try:
        with _interrupt_flag() as interrupted:
            while algorithm.env_steps < run_cfg.total_steps:
                metrics = _iteration(algorithm, loop, eval_env, run_cfg)
                steps = algorithm.env_steps
                loggers.log(metrics, steps)
                asked = hooks.call("on_iteration", metrics)
                if "eval/return" in metrics:
                    asked |= hooks.call("on_evaluation", _eval_part(metrics))
                reason = _early_stop(run_cfg, loop, time.perf_counter() - start, interrupted)
                if asked and reason is None:
                    reason = "callback"
                if reason is not None:
                    stop_reason = reason
                    break
                if run_cfg.checkpoint_every_steps and steps >= loop.next_checkpoint:
                    checkpoint = save()
                    loop.next_checkpoint = _next_multiple(steps, run_cfg.checkpoint_every_steps)
            if eval_env is not None and stop_reason != "interrupted":
                final = _final_evaluation(algorithm, loop, eval_env, run_cfg)
                if final:  # its own row, marked, after the last iteration's
                    loggers.log({**final, "eval/final": 1}, algorithm.env_steps)
                    hooks.call("on_evaluation", _eval_part(final))
            checkpoint = save()
            loggers.artifacts(run_dir / "config.json", checkpoint)
    except CallbackError as exc:
        # Between iterations the algorithm's state is whole: keep it before reporting.
        saved = save(notify=False)
        raise CallbackError(f"{exc}; the run is saved in {saved} (continue with --resume)") from exc
    except NaNLossError as exc:
        where = f"the last good checkpoint is {checkpoint}" if checkpoint else "no checkpoint yet"
        raise NaNLossError(f"{exc} at env step {algorithm.env_steps}; {where}") from exc
    finally:
        loggers.close()
        algorithm.close()
        if eval_env is not None:
            eval_env.close()
    result = RunResult(
        run_dir=run_dir,
        checkpoint=checkpoint,
        env_steps=algorithm.env_steps,
        iterations=algorithm.iteration,
        wall_s=time.perf_counter() - start,
        setup_s=setup_s,
        train_s=loop.train_s,
        eval_return=loop.eval_return,
        stop_reason=stop_reason,
        eval_step=loop.eval_step,
        session_train_s=loop.train_s - train_s_before,
        resumed_from=resumed_from,
        stop_detail=_stop_detail(stop_reason, run_cfg, loop, algorithm.env_steps, hooks),
    )
    hooks.call("on_train_end", result)
    return result


def check_runtime(spec: AlgorithmSpec, config: Any) -> None:
    """Refuse, before anything is built, what this machine or this algorithm cannot do: an
    unavailable ``run.device``, a precision the device lacks, a backend the learner lacks."""
    device = resolve_device(config.run.device)
    model = getattr(config, "model", None)
    if model is None:  # a variant's model is its nested base block's (DD-PPO's, APPO's ppo)
        blocks = [getattr(config, f.name) for f in dataclasses.fields(config)]
        model = next((b.model for b in blocks if is_nested(b) and hasattr(b, "model")), None)
    if model is None:
        return
    check_precision(model.precision, device)
    if model.backend not in spec.backends:
        raise ConfigError(
            f"model.backend = {model.backend!r} is not available for {spec.name}: its learner "
            f"trains through autograd (the NumPy path serves PPO and A2C); use "
            f"{' or '.join(spec.backends)}"
        )


def _iteration(algorithm: Algorithm, loop: _LoopState, eval_env: Any, run_cfg: Any) -> dict:
    """One training iteration, timed, then an evaluation when one is due."""
    t0 = time.perf_counter()
    steps_before = algorithm.env_steps
    metrics = algorithm.train_iteration()
    dt = time.perf_counter() - t0
    loop.train_s += dt
    metrics["perf/env_steps_per_s"] = (algorithm.env_steps - steps_before) / dt
    metrics["perf/iteration_s"] = dt
    steps = algorithm.env_steps
    if eval_env is not None and steps >= loop.next_eval:
        seed = derive_seed(run_cfg.seed, "eval", loop.evaluations)
        metrics.update(_evaluate(algorithm, loop, eval_env, seed))
        loop.evaluations += 1
        loop.next_eval = _next_multiple(steps, run_cfg.eval_every_steps)
    return metrics


def _evaluate(algorithm: Algorithm, loop: _LoopState, eval_env: Any, seed: int) -> dict:
    policy = algorithm.policy()
    if isinstance(policy, JointPolicy):
        metrics = evaluate_joint(policy, eval_env, seed)
    else:
        metrics = evaluate(policy, eval_env, seed)
    loop.eval_return = metrics["eval/return"]
    loop.eval_step = algorithm.env_steps
    return metrics


def _final_evaluation(
    algorithm: Algorithm, loop: _LoopState, eval_env: Any, run_cfg: Any
) -> dict | None:
    """Evaluate the final policy unless the last evaluation already saw it. Its seeds are
    its own, and the periodic evaluations' count stays, so a run stopped here and resumed
    evaluates exactly as one that never stopped."""
    steps = algorithm.env_steps
    if loop.eval_step == steps:
        return None
    return _evaluate(algorithm, loop, eval_env, derive_seed(run_cfg.seed, "final-eval", steps))


def _drop_reached_target(config: Any, resume: Checkpoint, loop: _LoopState) -> Any:
    """Resuming a run with ``run.total_steps`` beyond its checkpoint means "train for
    longer": a ``run.target_return`` the run has already reached would stop it after one
    iteration, so it is dropped, with a note. A higher target, not yet reached, is kept."""
    target = config.run.target_return
    if (
        target is None
        or loop.eval_return is None
        or loop.eval_return < target
        or config.run.total_steps <= int(resume.meta["env_steps"])
    ):
        return config
    print(
        f"note: the run had reached its target_return {target:g} (eval return "
        f"{loop.eval_return:.1f}); training on to run.total_steps {config.run.total_steps:,} "
        "without a target (set a higher --run.target-return to stop at one)"
    )
    return dataclasses.replace(config, run=dataclasses.replace(config.run, target_return=None))


def _eval_part(metrics: dict[str, float]) -> dict[str, float]:
    """The evaluation's metrics among an iteration's."""
    return {k: v for k, v in metrics.items() if k.startswith("eval/") and k != "eval/final"}


def _stop_detail(reason: str, run_cfg: Any, loop: _LoopState, steps: int, hooks: Callbacks) -> str:
    if reason == "target_return":
        return (
            f"the eval return {loop.eval_return:.1f} reached run.target_return "
            f"{run_cfg.target_return:g} at env step {loop.eval_step:,}"
        )
    if reason == "max_wall_s":
        return f"run.max_wall_s ({run_cfg.max_wall_s:g} s) elapsed at env step {steps:,}"
    if reason == "interrupted":
        return f"interrupted (Ctrl-C) at env step {steps:,}; continue with --resume"
    if reason == "callback":
        return f"{hooks.stop_reason} at env step {steps:,}"
    return f"run.total_steps {run_cfg.total_steps:,} reached ({steps:,} env steps)"


def _early_stop(
    run_cfg: Any, loop: _LoopState, elapsed_s: float, interrupted: threading.Event
) -> str | None:
    """Why to stop before total_steps, if at all."""
    target = run_cfg.target_return
    if target is not None and loop.eval_return is not None and loop.eval_return >= target:
        return "target_return"
    if run_cfg.max_wall_s is not None and elapsed_s > run_cfg.max_wall_s:
        return "max_wall_s"
    if interrupted.is_set():
        return "interrupted"
    return None


def _next_multiple(steps: int, every: int) -> int:
    """The first multiple of ``every`` after ``steps`` (every iteration when ``every`` is 0)."""
    return (steps // every + 1) * every if every else steps + 1


@dataclass
class _LoopState:
    """The loop's own counters, saved with checkpoints so a resumed run keeps its cadence."""

    next_eval: int = 0
    next_checkpoint: int = 0
    evaluations: int = 0
    eval_return: float | None = None
    train_s: float = 0.0
    eval_step: int | None = None


def _make_eval_env(config: Any, joint: bool = False):
    """The evaluation envs: one per evaluation episode; a multi-agent env itself when the
    policies of several groups act together (``joint``)."""
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


@contextmanager
def _interrupt_flag() -> Iterator[threading.Event]:
    """First Ctrl-C sets a flag that the loop checks between iterations (so it can save a
    consistent checkpoint); a second Ctrl-C interrupts immediately."""
    flag = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return

    def handler(signum: int, frame: Any) -> None:
        if flag.is_set():
            raise KeyboardInterrupt
        flag.set()
        print(
            "\ninterrupt: finishing this iteration and saving a checkpoint (Ctrl-C again to abort)"
        )

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield flag
    finally:
        signal.signal(signal.SIGINT, previous)
