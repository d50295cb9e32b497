"""Samplers: step environments with a copy of the policy and return time-major batches."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shoal.collect.env_runner import EnvRunner
from shoal.collect.local import LocalSampler
from shoal.config import EnvConfig, RunConfig
from shoal.core.seeding import derive_seed

__all__ = ["EnvRunner", "LocalSampler", "make_sampler"]


def make_sampler(
    env_config: EnvConfig,
    model_fn: Callable[[Any, Any], Any],
    num_steps: int,
    run: RunConfig,
    acting: str = "auto",
    own_stream: bool = False,
    obs_stats: dict[str, Any] | None = None,
) -> Any:
    """`LocalSampler` when ``run.runners`` is 0, else a `RaySampler` with that many runners.
    Runner ``i`` seeds its envs with ``derive_seed(run.seed, "env", i)``, as the local runner
    (``i`` = 0) does, and its action draws with ``derive_seed(run.seed, "runner-torch", i)``.
    ``own_stream``: the local runner draws from a torch stream of its own seeded the same way
    (`EnvRunner`'s ``own_torch_seed``), so a synchronous run with one Ray runner is the
    in-process run (the replay learners); without it, it draws from the process's generator
    with the learner (the on-policy learners, whose seeded results and learning checks were
    measured so). ``acting`` is the ``model.backend`` the runners act with; ``run.compile``
    compiles their networks; ``obs_stats``: frozen normalizer statistics (`EnvRunner`)."""
    if run.runners == 0:
        runner = EnvRunner(
            env_config,
            model_fn,
            num_steps,
            seed=derive_seed(run.seed, "env", 0),
            acting=acting,
            compiled=run.compile,
            own_torch_seed=derive_seed(run.seed, "runner-torch", 0) if own_stream else None,
            obs_stats=obs_stats,
        )
        return LocalSampler(runner)
    from shoal.collect.ray import RaySampler

    indices = range(run.runners)
    return RaySampler(
        env_config,
        model_fn,
        num_steps,
        seeds=[derive_seed(run.seed, "env", i) for i in indices],
        torch_seeds=[derive_seed(run.seed, "runner-torch", i) for i in indices],
        address=run.ray_address,
        max_restarts=run.max_worker_restarts,
        acting=acting,
        compiled=run.compile,
        obs_stats=obs_stats,
    )
