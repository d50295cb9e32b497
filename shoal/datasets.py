"""Dataset recipes: the offline datasets the tuned examples learn from, made by shoal itself.

D4RL's recipe (Fu et al. 2020, "D4RL: datasets for deep data-driven reinforcement
learning"): train an online agent; its policy stopped at about a third of the expert's
return gives the "medium" dataset (episodes of that policy), and its replay buffer up to that
point the "medium-replay" one. ``shoal collect --recipe NAME`` trains the source run (or
continues it: runs resume) and writes the dataset; the source run is shared by the recipes
that name it, so "medium" and "medium-replay" cost one run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shoal.errors import ShoalError


@dataclass(frozen=True)
class Source:
    """An online run that datasets are taken from."""

    name: str
    tuned: str
    """The tuned example it trains."""
    overrides: dict[str, Any]
    """Dotted config overrides: its length, checkpoint cadence, replay saved."""
    minutes: str
    """How long it takes on this project's 2-core machine."""


@dataclass(frozen=True)
class Recipe:
    name: str
    source: Source
    step: int
    """The source run's checkpoint the data is taken at (the "medium" policy)."""
    from_replay: bool = False
    """Export that checkpoint's replay buffer instead of recording episodes."""
    episodes: int = 100
    noise: float = 0.0
    expert_score: float | None = None
    """The dataset's 100: a stated return, or None for the source run's final policy."""
    collect: dict[str, Any] = field(default_factory=dict)


_PENDULUM = Source(
    "pendulum-sac",
    "sac-pendulum",
    {"seed": 1, "run.total_steps": 4800, "run.target_return": None, "replay.save": True,
     "run.checkpoint_every_steps": 100, "run.keep_checkpoints": 50,
     "run.eval_every_steps": 100},
    "about 1",
)  # fmt: skip
_HALFCHEETAH = Source(
    "halfcheetah-sac",
    "sac-halfcheetah",
    {"seed": 0, "run.total_steps": 100_000, "run.checkpoint_every_steps": 25_000,
     "run.keep_checkpoints": 20, "replay.save": True, "replay.buffer_size": 300_000,
     "run.eval_every_steps": 25_000, "run.eval_episodes": 5, "run.torch_threads": 1},
    "about 30",  # evaluation returns 3,060 at 50k steps, 4,583 at 75k (normalized 39)
)  # fmt: skip
_CARTPOLE = Source(
    "cartpole-dqn",
    "dqn-cartpole",
    {"seed": 0, "run.total_steps": 60_000, "run.target_return": None, "replay.save": True,
     "run.checkpoint_every_steps": 4096, "run.keep_checkpoints": 20,
     "run.eval_every_steps": 4096},
    "about 1",
)  # fmt: skip
D4RL_HALFCHEETAH_EXPERT = 12135.0
"""D4RL's expert reference return on HalfCheetah (its ``REF_MAX_SCORE``), the 100 of the
normalized scores CORL and the IQL, CQL and TD3+BC papers report."""

RECIPES = {
    r.name: r
    for r in (
        # SAC learns Pendulum's swing-up within 100 steps (normalized 15 at step 1,500, 69 at
        # 1,600): the 1,600-step policy with noise 0.3 scores about 50.
        Recipe("pendulum-medium", _PENDULUM, 1600, episodes=50, noise=0.3),
        Recipe("pendulum-medium-replay", _PENDULUM, 1600, from_replay=True),
        Recipe("halfcheetah-medium", _HALFCHEETAH, 75_000, episodes=100,
               expert_score=D4RL_HALFCHEETAH_EXPERT),
        Recipe("halfcheetah-medium-replay", _HALFCHEETAH, 75_000, from_replay=True,
               expert_score=D4RL_HALFCHEETAH_EXPERT),
        # DQN scores 256 at its first checkpoint; epsilon 0.1 brings it to about 37.
        Recipe("cartpole-medium", _CARTPOLE, 4096, episodes=100, collect={"epsilon": 0.1}),
    )
}  # fmt: skip


def make_dataset(name: str, out: str | Path | None = None, runs: str | Path = "runs/datasets"):
    """Make the recipe ``name``'s dataset in ``out`` (default ``datasets/NAME``), training
    its source run under ``runs`` first where it has not reached its end; returns the path."""
    import shoal
    from shoal.train.checkpoint import load_checkpoint

    recipe = RECIPES.get(name)
    if recipe is None:
        raise ShoalError(f"unknown dataset recipe {name!r}; recipes: {', '.join(RECIPES)}")
    source = recipe.source
    run_dir = Path(runs) / source.name
    total = int(source.overrides["run.total_steps"])
    done = 0
    if (run_dir / "checkpoints").is_dir():
        done = int(load_checkpoint(run_dir).meta["env_steps"])
    if done == 0:
        shoal.train(tuned=source.tuned, run_dir=str(run_dir), **source.overrides)
    elif done < total:
        shoal.train(resume=run_dir, total_steps=total)
    checkpoint = run_dir / "checkpoints" / f"step_{recipe.step:012d}"
    if not checkpoint.is_dir():
        raise ShoalError(f"{run_dir} has no checkpoint at step {recipe.step:,}")
    out = Path(out) if out is not None else Path("datasets") / name
    expert = None if recipe.expert_score is not None else run_dir
    return shoal.collect(out, checkpoint, episodes=recipe.episodes, noise=recipe.noise,
                         from_replay=recipe.from_replay, expert=expert,
                         ref_max_score=recipe.expert_score, **recipe.collect)  # fmt: skip
