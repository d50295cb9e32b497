"""The narrow contracts between the parts of shoal (see DESIGN.md's picture).

A sampler steps environments with a copy of the policy; a learner turns batches into updates
and hands out weights; an algorithm ties the two together for one training iteration, which the
training loop in `shoal.train.loop` drives. Local and Ray samplers satisfy the same protocol,
so an algorithm does not know where its data came from.

Where later features plug in:

* Recurrent policies: the `EnvRunner` is the one place that carries state across steps; it
  resets a policy's recurrent state where `StepResult.autoreset` marks an episode start and
  records the state at the start of each rollout in `Rollout.policy_state`.
* Multi-agent groups: arrays gain an agent axis after the env axis (``[T, B, N, ...]``); the
  return estimators in `shoal.losses` already accept trailing axes, and per-agent returns are
  logged as ``episode/return/<agent>``.
* Replay storage: `Sampler.sample` returns whatever batch type the algorithm stores (a
  `Rollout` for on-policy learners, transitions for replay buffers in ``shoal.data``).
* Ray: `EnvRunner` is built from plain config values and a model factory, so a remote actor
  can construct the same class; weights travel through ``get_weights``/``set_weights``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np
import torch

Weights = Mapping[str, torch.Tensor]


class Policy(Protocol):
    """A deployable policy: numpy observations of a batch of envs in, numpy actions out."""

    def act(self, obs: np.ndarray, deterministic: bool = True) -> np.ndarray: ...


class Learner(Protocol):
    """Owns networks and optimizers. Its ``update`` takes the algorithm's own batch type and
    hyperparameters of the moment (learning rate, clip range, ...), so only the parts that
    samplers and checkpoints rely on are common."""

    def get_weights(self) -> Weights: ...

    def set_weights(self, weights: Weights) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class Sampler(Protocol):
    """Produces batches of experience with the latest weights it was given."""

    def sample(self) -> Any: ...

    def set_weights(self, weights: Weights) -> None: ...

    def get_state(self) -> dict[str, Any]: ...

    def set_state(self, state: dict[str, Any], fallback_seed: int) -> bool:
        """Restore mid-episode state; False when the envs restarted with ``fallback_seed``."""
        ...

    def close(self) -> None: ...


class Algorithm(Protocol):
    """What the training loop drives: one iteration at a time, plus state for checkpoints.
    An iteration is whatever the algorithm learns from at once: a rollout of its vector envs,
    a population evaluated by whole episodes, a pass over a dataset."""

    env_steps: int
    """The run's progress: what ``run.total_steps`` and the evaluation and checkpoint
    cadences count. Env steps taken (summed over parallel envs, a population's included,
    the autoreset step after each episode's end included: see `RunConfig.total_steps`); a
    learner that steps no env (offline) counts its gradient updates."""
    iteration: int

    def train_iteration(self) -> dict[str, float]: ...

    def policy(self) -> Policy: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        """Restore a checkpointed state; False when environments had to restart their
        episodes instead of continuing them (see `shoal.envs.snapshot`)."""
        ...

    def close(self) -> None: ...


class ActsJointly(Protocol):
    """An algorithm whose spec declares ``acts_jointly``."""

    joint: bool
    """Several agent groups' policies act together in this run."""


class OwnSpaces(Protocol):
    """An algorithm whose spec declares ``own_spaces``."""

    deploy_spaces: tuple[Any, Any]
    """(observation space, action space) of its deployed policy."""


class ExtraEvaluation(Protocol):
    """An algorithm whose spec declares ``extra_evaluation``."""

    def eval_metrics(self, metrics: dict[str, float]) -> dict[str, float]: ...


class AlgorithmSpec(Protocol):
    """What the training loop needs of a registered algorithm (`shoal.registry`; read-only,
    as the registry's frozen specs are)."""

    @property
    def name(self) -> str: ...

    @property
    def algorithm_cls(self) -> Callable[[Any], Algorithm]: ...

    @property
    def backends(self) -> tuple[str, ...]:
        """The ``model.backend`` values its learner supports."""
        ...

    @property
    def runners(self) -> bool:
        """Whether it samples on Ray runners when ``run.runners`` > 0."""
        ...

    @property
    def learner_groups(self) -> bool:
        """Whether its learner runs as a data-parallel group when ``run.learners`` > 1."""
        ...

    @property
    def gradients(self) -> bool:
        """Whether it learns by gradient steps (False: tabular, evolution, planning)."""
        ...

    @property
    def no_runners(self) -> str:
        """Why an algorithm without runners has none ("": it samples in-process, no runners
        yet)."""
        ...

    @property
    def one_learner(self) -> str:
        """Why a gradient learner without learner groups keeps one ("": none yet)."""
        ...

    def scaling(self) -> dict[str, str | None]:
        """The settings it scales out with: ``runners``, ``sampling ahead``, ``learners``."""
        ...

    @property
    def prepare(self) -> Callable[[Any], Any] | None:
        """``prepare(config) -> config`` before anything is built, or None."""
        ...

    @property
    def acts_jointly(self) -> bool: ...

    @property
    def own_spaces(self) -> bool: ...

    @property
    def extra_evaluation(self) -> bool: ...

    def default_config(self) -> Any:
        """The config the algorithm starts from (its defaults under this name)."""
        ...

    def unit(self, config: Any) -> str:
        """What a run's progress counts, a singular noun: "env step", "update", ..."""
        ...
