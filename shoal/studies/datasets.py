"""Making offline datasets: ``shoal collect`` (`collect`) from a run's policy, a random policy
or a run's saved replay, and the recipes of the tuned examples' datasets (`make_dataset`).

D4RL's recipe (Fu et al. 2020, "D4RL: datasets for deep data-driven reinforcement
learning"): train an online agent; its policy stopped at about a third of the expert's
return gives the "medium" dataset (episodes of that policy), and its replay buffer up to that
point the "medium-replay" one. ``shoal collect --recipe NAME`` trains the source run (or
continues it: runs resume) and writes the dataset; the source run is shared by the recipes
that name it, so "medium" and "medium-replay" cost one run.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from shoal.api import load, train, use_run_threads
from shoal.collect.record import BatchPolicy, exploring, random_policy, record_episodes
from shoal.config import EnvConfig, from_dict, replace, to_dict
from shoal.core.errors import DatasetError, ShoalError
from shoal.data.offline import Episode, episodes_from_replay, write_dataset
from shoal.envs import VectorEnv, make_env
from shoal.envs.agents_as_batch import actor_space, critic_part
from shoal.nn.policy import ActorPolicy, JointPolicy
from shoal.registry import get_algorithm
from shoal.train.checkpoint import Checkpoint, load_checkpoint

_NOT_RECORDED = {"num_envs", "vectorization", "normalize_obs", "normalize_reward", "clip_obs",
                 "clip_reward", "gamma", "atari_training"}  # fmt: skip
"""Env settings a dataset does not record: how many envs stepped it, how a learner scaled it."""


def collect(
    out: str | Path,
    run: str | Path | None = None,
    *,
    episodes: int = 100,
    env: str | None = None,
    noise: float = 0.0,
    epsilon: float = 0.0,
    stochastic: bool = False,
    from_replay: bool = False,
    expert: str | Path | None = None,
    ref_episodes: int = 10,
    ref_max_score: float | None = None,
    num_envs: int = 8,
    seed: int = 0,
    trust_code: bool = False,
    countdown: Callable[[int, str], AbstractContextManager[Callable[[int], None]]] | None = None,
) -> Path:
    """``shoal collect``: write a Minari dataset to the new directory ``out`` and return it.

    The episodes come from ``run``'s trained policy (deterministic unless ``stochastic``;
    ``noise`` and ``epsilon`` make medium and mixed-quality data, see
    `shoal.collect.record.exploring`), from a uniformly random policy on ``env`` when
    ``run`` is None, or, with ``from_replay``, from the replay buffer ``run`` saved
    (``--replay.save``). The dataset records its reference scores over ``ref_episodes``
    episodes each: a random policy's mean return, and ``expert``'s (default: ``run``'s own
    policy, deterministic) unless ``ref_max_score`` states the expert's return, so
    normalized scores work on it. ``countdown(total, label)`` shows each stage's progress
    (`shoal.train.progress.Countdown`)."""

    def counted(total: int, label: str) -> AbstractContextManager[Callable[[int], None] | None]:
        return contextlib.nullcontext() if countdown is None else countdown(total, label)

    if run is None and env is None:
        raise ShoalError("name a run to collect from, or an env for a random policy (--env ID)")
    if from_replay and run is None:
        raise ShoalError("--from-replay exports a run's saved replay buffer: name the run")
    shaping = [name for name, on in (("--noise", noise > 0), ("--epsilon", epsilon > 0),
                                     ("--stochastic", stochastic)) if on]  # fmt: skip
    if shaping and (run is None or from_replay):
        source = "a saved replay buffer" if from_replay else "a uniformly random policy"
        raise ShoalError(f"{' and '.join(shaping)} change how a run's policy acts; "
                         f"{source} has no such policy to change: leave them out")  # fmt: skip
    checkpoint = None if run is None else load_checkpoint(run, trust_code=trust_code)
    if checkpoint is not None:
        use_run_threads(checkpoint)
    if checkpoint is not None:
        env_config: EnvConfig = from_dict(get_algorithm(checkpoint.algo).config_cls,
                                          checkpoint.config).env  # fmt: skip
    else:
        env_config = from_dict(EnvConfig, {"id": env})
    if env is not None:
        env_config = replace(env_config, id=env)
    env_config = replace(env_config, num_envs=num_envs, normalize_obs=False,
                         normalize_reward=False, atari_training=False)  # fmt: skip
    policy = None if run is None else _one_agent(load(run, trust_code=trust_code), run)
    vector_env = make_env(env_config)
    space = vector_env.action_space
    if noise > 0 and not isinstance(space, gym.spaces.Box):
        vector_env.close()
        raise ShoalError(f"--noise adds Gaussian noise to continuous (Box) actions; "
                         f"{env_config.id}'s actions are {space}: use --epsilon for random "
                         "actions instead")  # fmt: skip
    # A MAPPO run (env.global_state) acts on rows that end with its critic's global state: the
    # dataset keeps each row's actor part, what the deployed policy reads, and names its env
    # without the global state.
    critic_columns = critic_part(vector_env.observation_space)
    observation_space = actor_space(vector_env.observation_space)
    try:
        if from_replay and run is not None and checkpoint is not None:  # (required above)
            data = episodes_from_replay(_saved_replay(run, checkpoint))
            collector = f"the replay buffer of {run}"
        elif policy is None:
            with counted(episodes, "episodes") as tick:
                data = record_episodes(random_policy(space, seed), vector_env, episodes, seed,
                                       tick)  # fmt: skip
            collector = "a uniformly random policy"
        else:
            act = exploring(lambda obs: policy.act(obs, deterministic=not stochastic), space,
                            noise, epsilon, seed)  # fmt: skip
            with counted(episodes, "episodes") as tick:
                data = record_episodes(act, vector_env, episodes, seed, tick)
            collector = (f"{run} ({'stochastic' if stochastic else 'deterministic'}, "
                         f"noise {noise:g}, epsilon {epsilon:g})")  # fmt: skip
        with counted(ref_episodes, "random policy's reference episodes") as tick:
            random_score = _mean_score(random_policy(space, seed + 1), vector_env,
                                       ref_episodes, seed + 1, tick)  # fmt: skip
        reference = policy
        if expert is not None:
            reference = _one_agent(load(expert, trust_code=trust_code), expert)
            _check_reads(reference, vector_env.observation_space, expert)
        expert_score = ref_max_score
        if reference is not None and expert_score is None:
            with counted(ref_episodes, "expert's reference episodes") as tick:
                expert_score = _mean_score(lambda obs: reference.act(obs, deterministic=True),
                                           vector_env, ref_episodes, seed + 2, tick)  # fmt: skip
    finally:
        vector_env.close()
    if not data:
        raise DatasetError(f"{collector} holds no whole episode to write")
    if critic_columns:
        data = [_actor_part(e, critic_columns) for e in data]
        env_config = replace(env_config, global_state=False)
    defaults = to_dict(EnvConfig(id=env_config.id))  # what shapes the data: id, options, ...
    described = {k: v for k, v in to_dict(env_config).items()
                 if k == "id" or (k not in _NOT_RECORDED and v != defaults[k])}  # fmt: skip
    metadata = {"collector": collector, "ref_episodes": ref_episodes, "seed": seed}
    if checkpoint is not None:
        metadata["algorithm_name"] = checkpoint.algo
    return write_dataset(out, data, observation_space, space, described,
                         random_score, expert_score, metadata)  # fmt: skip


def _actor_part(episode: Episode, critic_columns: int) -> Episode:
    """``episode`` with the critic's columns cut from the end of each observation row."""
    return dataclasses.replace(episode, observations=episode.observations[:, :-critic_columns])


def _check_reads(policy: ActorPolicy, space: Any, run: str | Path) -> None:
    """Refuse an expert whose policy reads other observations than the env gives (another
    env, or a MAPPO run's rows against a run's without the global state)."""
    if policy.observation_space is not None and policy.observation_space != space:
        raise ShoalError(
            f"the expert {run} reads observations {policy.observation_space}, but the env the "
            f"dataset comes from gives {space}: name an expert trained on the same env settings"
        )


def _one_agent(policy: ActorPolicy | JointPolicy, run: str | Path) -> ActorPolicy:
    """``policy``, refused when it is the joint policy of several agent groups: a dataset
    holds the episodes of one policy (one agent's, or each agent's of a shared group)."""
    if isinstance(policy, JointPolicy):
        raise ShoalError(
            f"{run} has several agent groups, each with its own policy: a dataset holds one "
            "policy's episodes; collect from a run whose agents share one policy (IPPO on "
            "one group) or a single-agent run"
        )
    return policy


def _saved_replay(run: str | Path, checkpoint: Checkpoint) -> dict[str, Any]:
    if checkpoint.setting("env.normalize_obs"):
        raise DatasetError(
            f"{run} stored normalized observations (env.normalize_obs) under statistics that "
            "moved as it trained: its replay cannot be turned back into raw observations"
        )
    replay = checkpoint.replay
    if replay is None:
        raise DatasetError(
            f"{run} saved no replay buffer: train it with --replay.save to export its replay"
        )
    return replay


def _mean_score(act: BatchPolicy, env: VectorEnv, episodes: int, seed: int,
                progress: Callable[[int], None] | None = None) -> float:  # fmt: skip
    return float(np.mean([e.score for e in record_episodes(act, env, episodes, seed, progress)]))


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


def make_dataset(
    name: str,
    out: str | Path | None = None,
    runs: str | Path = "runs/datasets",
    countdown: Callable[[int, str], AbstractContextManager[Callable[[int], None]]] | None = None,
) -> Path:
    """Make the recipe ``name``'s dataset in ``out`` (default ``datasets/NAME``), training
    its source run under ``runs`` first where it has not reached its end; returns the path.
    ``countdown``: as `collect` takes it."""
    recipe = RECIPES.get(name)
    if recipe is None:
        raise ShoalError(f"unknown dataset recipe {name!r}; recipes: {', '.join(RECIPES)}")
    source = recipe.source
    run_dir = Path(runs) / source.name
    total = int(source.overrides["run.total_steps"])
    done = 0
    if (run_dir / "checkpoints").is_dir():
        done = load_checkpoint(run_dir).env_steps
    if done == 0:
        train(tuned=source.tuned, run_dir=str(run_dir), **source.overrides)
    elif done < total:
        train(resume=run_dir, total_steps=total)
    checkpoint = run_dir / "checkpoints" / f"step_{recipe.step:012d}"
    if not checkpoint.is_dir():
        raise ShoalError(f"{run_dir} has no checkpoint at step {recipe.step:,}")
    out = Path(out) if out is not None else Path("datasets") / name
    expert = None if recipe.expert_score is not None else run_dir
    return collect(out, checkpoint, episodes=recipe.episodes, noise=recipe.noise,
                   from_replay=recipe.from_replay, expert=expert,
                   ref_max_score=recipe.expert_score, countdown=countdown,
                   **recipe.collect)  # fmt: skip
