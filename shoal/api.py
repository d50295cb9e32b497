"""The Python API, mirroring the CLI: ``shoal.train``, ``shoal.load``, ``shoal.make_env``."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from shoal.config import EnvConfig, from_dict, replace
from shoal.core.errors import ShoalError
from shoal.core.threads import set_compute_threads
from shoal.envs import VectorEnv
from shoal.envs import make_env as _make_env
from shoal.envs.games import is_game_id
from shoal.envs.spaces import space_from_json
from shoal.nn.policy import ActorPolicy, JointPolicy
from shoal.registry import algorithm_for_config, find_tuned, get_algorithm
from shoal.studies.evaluation import Evaluation
from shoal.train.checkpoint import Checkpoint, incompatible, load_checkpoint
from shoal.train.loop import IterationCallback, RunResult, run


def build_config(
    algo_or_config: Any = "ppo",
    env: str | None = None,
    tuned: str | None = None,
    **overrides: Any,
) -> Any:
    """A validated config: an algorithm's defaults (or a tuned example), then overrides.

    Overrides use dotted names for nested blocks: ``build_config("ppo", **{"run.seed": 3})``;
    the plain keywords ``seed``, ``total_steps`` and ``run_dir`` are shorthands for ``run.*``.
    """
    if tuned is not None:
        config = find_tuned(tuned).build_config()
    elif isinstance(algo_or_config, str):
        config = get_algorithm(algo_or_config).default_config()
    else:
        config = algo_or_config
    for short in ("seed", "total_steps", "run_dir", "target_return"):
        if short in overrides:
            overrides[f"run.{short}"] = overrides.pop(short)
    if env is not None:
        overrides["env.id"] = env
    return replace(config, **overrides) if overrides else config


def train(
    algo_or_config: Any = "ppo",
    *,
    env: str | None = None,
    tuned: str | None = None,
    resume: str | Path | None = None,
    on_iteration: IterationCallback | None = None,
    callbacks: Sequence[Any] = (),
    quiet: bool = False,
    trust_code: bool = False,
    **overrides: Any,
) -> RunResult:
    """Train and return a `RunResult` (run directory, checkpoint, final evaluation, timings).

    ``shoal.train("ppo", env="CartPole-v1")``, ``shoal.train(tuned="ppo-cartpole")``,
    ``shoal.train(PPOConfig(...))`` or ``shoal.train(resume="runs/...", total_steps=10**6)``
    (a resumed run keeps its saved config unless a config of the same algorithm is given).
    ``callbacks``: objects with training events (`shoal.train.callbacks.Callback`), called
    after those ``run.callbacks`` names. ``quiet``: no progress on the console
    (``run.console`` off). ``trust_code``: a resumed run may import users' modules from the
    directories its checkpoint records (off: only from the installed packages and the
    working directory).
    """
    if quiet:
        overrides["run.console"] = False
    if resume is not None:
        checkpoint = load_checkpoint(resume, trust_code=trust_code, set_aside=True)
        spec = get_algorithm(checkpoint.algo)
        config = algo_or_config
        if not isinstance(config, spec.config_cls):  # default: the run's own config
            config = from_dict(spec.config_cls, checkpoint.config)
        config = build_config(config, env=env, **overrides)
        return run(spec, config, resume=checkpoint, on_iteration=on_iteration, callbacks=callbacks)
    config = build_config(algo_or_config, env=env, tuned=tuned, **overrides)
    spec = algorithm_for_config(config)
    return run(spec, config, on_iteration=on_iteration, callbacks=callbacks)


def load(path: str | Path, trust_code: bool = False) -> ActorPolicy | JointPolicy:
    """The trained policy of a run (or of one checkpoint) with ``act(obs)``: an `ActorPolicy`,
    or a `JointPolicy` (``act({group: obs})``) for a run whose agent groups all learned.
    ``trust_code``: import users' modules (an encoder, say) from the directories the run
    records; off, only from the installed packages and the working directory."""
    checkpoint = load_checkpoint(path, trust_code=trust_code)
    spec = get_algorithm(checkpoint.algo)
    config: Any = from_dict(spec.config_cls, checkpoint.config)
    spaces = checkpoint.spaces
    if checkpoint.joint:
        model = spec.build_model(config, None, None)
        try:
            model.load_state_dict(checkpoint.policy_weights)
        except (KeyError, RuntimeError) as exc:
            raise incompatible(checkpoint.path, exc) from exc
        return JointPolicy(model, config)
    if spaces:  # recorded by the run: no env needed
        observation_space = space_from_json(spaces["observation"])
        action_space = space_from_json(spaces["action"])
    else:  # a checkpoint from before spaces were recorded: read them off the env
        probe = _make_env(replace(config.env, num_envs=1, vectorization="sync"))
        observation_space, action_space = probe.observation_space, probe.action_space
        probe.close()
    model = spec.build_model(config, observation_space, action_space)
    try:
        model.load_state_dict(checkpoint.policy_weights)
        obs_stats = checkpoint.policy_obs_stats
    except (KeyError, RuntimeError) as exc:
        raise incompatible(checkpoint.path, exc) from exc
    return ActorPolicy(
        model,
        obs_stats,
        config.env.clip_obs,
        config,
        observation_space=observation_space,
        action_space=action_space,
    )


def evaluate(
    run: str | Path,
    episodes: int = 10,
    *,
    seed: int = 12345,
    deterministic: bool | None = None,
    fixed: dict[str, str] | None = None,
    env_kwargs: dict[str, Any] | None = None,
    trust_code: bool = False,
) -> dict[str, Any]:
    """``shoal eval`` in Python: the statistics ``shoal eval RUN --json`` prints (the return
    over ``episodes`` episodes with its 95% interval, per group and agent, a game's win /
    draw / loss rates, the env's own statistics); for an AlphaZero run, its search's wins,
    draws and losses in ``episodes`` games against a random and a minimax player.
    ``deterministic`` picks greedy (True) or sampled (False) actions; None acts as the run's
    ``run.eval_actions`` names, as its training evaluations did. ``fixed`` puts
    ``{group or agent: "random" | "module:Class"}`` players in trained ones' places;
    ``env_kwargs`` changes env options (`shoal.studies.evaluation.Evaluation`); ``trust_code`` as
    `load`'s."""
    check_episodes(episodes)
    checkpoint = load_checkpoint(run, trust_code=trust_code)
    use_run_threads(checkpoint)
    if plays_a_game(checkpoint):  # matches against fixed players, not env episodes
        return game_report(checkpoint, episodes, seed)
    pools = any(str(spec).startswith("pool:") for spec in (fixed or {}).values())
    loader = functools.partial(load, trust_code=trust_code)
    evaluation = Evaluation(
        loader(run), fixed, env_kwargs, loader=loader, checkpoint=checkpoint if pools else None
    )
    return evaluation.statistics(episodes, seed, deterministic)


def check_episodes(episodes: int) -> None:
    if not isinstance(episodes, int) or episodes < 1:
        raise ShoalError(f"episodes must be a whole number >= 1, not {episodes!r}")


def use_run_threads(checkpoint: Checkpoint) -> None:
    """Compute with the run's ``run.torch_threads``, as its training did: PyTorch's default of
    a thread per core makes the small networks of control tasks and searches slower (a MuZero
    run's ``shoal eval`` took 97.5 s with PyTorch's default against 7.3 s with one thread)."""
    threads = checkpoint.setting("run.torch_threads", 1)
    set_compute_threads(max(1, int(threads)))


def plays_a_game(checkpoint: Checkpoint) -> bool:
    """Whether a run plays a two-player game, evaluated by matches: an algorithm that plays
    games (`shoal.algos.spec.AlgorithmSpec.match_report`: AlphaZero, MuZero) on a game's id."""
    spec = get_algorithm(checkpoint.algo)
    env_id = str(checkpoint.setting("env.id", ""))
    return spec.match_report is not None and is_game_id(env_id)


def game_report(checkpoint: Checkpoint, games: int, seed: int,
                progress: Callable[[int], None] | None = None) -> dict[str, Any]:  # fmt: skip
    """A game-playing run's search against a random and a minimax player, ``games`` games
    each (``shoal eval``'s report for such runs); ``progress`` is told the count of the
    ``2 * games`` finished."""
    report = get_algorithm(checkpoint.algo).match_report
    if report is None:
        raise ShoalError(f"{checkpoint.algo} does not play games")
    return report(checkpoint, games, seed, progress)


def make_env(env: str | EnvConfig, num_envs: int | None = None, **kwargs: Any) -> VectorEnv:
    """A shoal vector env (not yet reset) from an id or an `EnvConfig`, with ``num_envs``
    parallel envs (default: the config's own, or 1 for an id). Unlike Gymnasium's vector
    envs, ``reset(seed)`` returns the observations alone and ``step`` one `StepResult`
    (`shoal.envs.base.VectorEnv`)."""
    if isinstance(env, EnvConfig):
        if kwargs:
            raise TypeError(f"pass settings in the EnvConfig, not as keywords: {sorted(kwargs)}")
        config = env
    else:
        config = from_dict(EnvConfig, {"id": env, "num_envs": 1, **kwargs})
    if num_envs is not None and num_envs != config.num_envs:
        config = replace(config, num_envs=num_envs)
    return _make_env(config)


__all__ = ["build_config", "evaluate", "load", "make_env", "train"]
