"""Where a run lives on disk: its directory, the one-line errors for files it cannot write,
and what every checkpoint records beside the weights so the policy deploys without its env."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from shoal.core.errors import ShoalError
from shoal.core.imports import import_dirs
from shoal.core.interfaces import AlgorithmSpec
from shoal.envs import make_env
from shoal.envs.spaces import space_to_json
from shoal.train.checkpoint import Checkpoint


def default_run_dir(algo: str, env_id: str) -> Path:
    """``runs/<algo>-<env>-<date>-<time>``, with every character of the env id that is not a
    letter, digit, dot, dash or underscore (``/``, ``:`` of ``pettingzoo:`` and ``module:``
    ids) as ``_``, so the name is valid on every file system and safe for scp and rsync."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    return Path("runs") / f"{algo}-{re.sub(r'[^A-Za-z0-9._-]', '_', env_id)}-{stamp}"


def record_for_deploy(
    config: Any, eval_env: Any, joint: bool = False, spaces: tuple | None = None
) -> dict[str, Any]:
    """What `shoal.load` needs besides the weights, for every checkpoint's ``meta.json``: the
    observation and action spaces of the deployed policy (so it loads without building its
    env) and the directories custom env modules were imported from. ``joint``: the run
    deploys the policies of several agent groups (`shoal.nn.policy.JointPolicy`), which load
    from the config alone. ``spaces``: the algorithm's own (observation, action) spaces, for
    a learner whose env is not a Gymnasium one (a game searched by AlphaZero)."""
    if joint:
        return {"spaces": None, "joint": True, "import_dirs": import_dirs()}
    if spaces is not None:
        given = {"observation": space_to_json(spaces[0]), "action": space_to_json(spaces[1])}
        return {"spaces": given, "import_dirs": import_dirs()}
    env = eval_env
    if env is None:
        env = make_env(dataclasses.replace(config.env, num_envs=1, vectorization="sync"))
    described: dict[str, Any] | None
    try:
        described = {
            "observation": space_to_json(env.observation_space),
            "action": space_to_json(env.action_space),
        }
    except TypeError:
        described = None  # a space shoal cannot describe: load builds the env as before
    finally:
        if env is not eval_env:
            env.close()
    return {"spaces": described, "import_dirs": import_dirs()}


def resolve_run_dir(
    spec: AlgorithmSpec, config: Any, resume: Checkpoint | None
) -> tuple[Path, Path | None]:
    """The run directory, created, and the outermost directory this call created (to remove
    if the run fails to start); a new run never reuses the directory of another run."""
    if resume is not None:
        return resume.path.parent.parent, None
    run_cfg = config.run
    run_dir = (
        Path(run_cfg.run_dir) if run_cfg.run_dir else default_run_dir(spec.name, config.env.id)
    )
    if (run_dir / "checkpoints").exists():
        raise ShoalError(
            f"{run_dir} already holds a run; resume it with --resume {run_dir} "
            "or choose another run.run_dir"
        )
    created = None
    if not run_dir.exists():
        created = run_dir.absolute()
        while not created.parent.exists():
            created = created.parent
    guarded_write(lambda: run_dir.mkdir(parents=True, exist_ok=True))
    return run_dir, created


def guarded_write(make: Callable[[], Any]) -> Any:
    """``make()``, with a file-system error (read-only or full disk, no permission) as one
    line naming the path instead of a traceback."""
    try:
        return make()
    except OSError as exc:
        where = f" {exc.filename}" if exc.filename else ""
        raise ShoalError(f"cannot write{where}: {exc.strerror or exc}") from None
