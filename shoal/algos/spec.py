"""The contract between an algorithm and the library: `AlgorithmSpec`, which each algorithm
module declares as ``SPECS`` (one spec per name it registers; `shoal.registry` imports the
module when one of its names is asked for).

A spec holds what the layers above need of an algorithm, *declared* rather than probed: how to
build its learner and its deployed model, what its progress counts, what it deploys, whether
it samples on Ray runners, plays games or reads settings from outside its config. The learner
itself is `shoal.core.interfaces.Algorithm`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from shoal.config import replace


@dataclass(frozen=True)
class AlgorithmSpec:
    name: str
    config_cls: type
    algorithm_cls: Callable[[Any], Any]
    """Builds the `shoal.core.interfaces.Algorithm` from a config."""
    build_model: Callable[..., Any]
    """``build_model(config, obs_space, action_space)``: the policy network, for loading."""
    summary: str
    action_spaces: str
    defaults: dict[str, Any] = field(default_factory=dict)
    """Field values that differ from ``config_cls``'s defaults under this name, so that names
    sharing one config class (``q-learning``, ``sarsa``, ... all use `TabularConfig`; ``mappo``
    is PPO with ``env.global_state``) start from their own settings. Dotted keys name fields
    of nested blocks."""
    backends: tuple[str, ...] = ("auto", "torch")
    """The ``model.backend`` values its learner supports (numpy: PPO's and A2C's)."""
    prepare: Callable[[Any], Any] | None = None
    """``prepare(config) -> config``, before anything is built: settings read from outside
    the config (an offline learner's env from its dataset)."""
    runners: bool = False
    """It samples on Ray actors when ``run.runners`` > 0; the training loop refuses
    ``run.runners`` > 0 for an algorithm without this (it would sample in-process)."""
    no_runners: str = ""
    """Why an algorithm without ``runners`` has none, in the words of the refusal of
    ``run.runners`` > 0 ("": it samples in the learner's process, with no runners yet)."""
    learner_groups: bool = False
    """Its learner runs as a data-parallel group when ``run.learners`` > 1
    (`shoal.algos.cores.learner_group`); the training loop refuses ``run.learners`` > 1 for
    an algorithm without this."""
    gradients: bool = True
    """It learns by gradient steps (False: tabular updates, evolution, planning), which a
    learner group would split; for the refusal's words."""
    one_learner: str = ""
    """Why a gradient learner without ``learner_groups`` keeps one learner, in the words of
    the refusal of ``run.learners`` > 1 ("" : it has none yet)."""
    deploys_search: bool = False
    """Its deployed policy (``shoal.load``) searches at every step, a program around its
    network rather than one network: ``shoal export`` refuses it."""
    match_report: Callable[..., dict[str, Any]] | None = None
    """It plays two-player games: on a game it evaluates by matches against fixed players
    every ``eval_every`` iterations, and ``shoal eval`` reports
    ``match_report(checkpoint, games, seed, progress)`` (AlphaZero, MuZero; ``progress``
    told the count of the ``2 * games`` finished)."""
    deploys: bool = True
    """Its runs hold a policy for ``shoal.load``, ``shoal eval`` and ``shoal export`` (mcts
    plans with the env's own state and holds none)."""
    acts_jointly: bool = False
    """Its algorithm has ``joint`` (`shoal.core.interfaces.ActsJointly`): True in a run where
    several agent groups' policies act together, which the run then evaluates as one
    `shoal.nn.policy.JointPolicy`, reporting each group (MADDPG, PPO's policy map)."""
    own_spaces: bool = False
    """Its algorithm has ``deploy_spaces`` (`shoal.core.interfaces.OwnSpaces`): the observation
    and action spaces its deployed policy takes, where they are not the env's (a game's
    board planes, a dataset's spaces)."""
    extra_evaluation: bool = False
    """Its algorithm has ``eval_metrics(metrics)`` (`shoal.core.interfaces.ExtraEvaluation`):
    more evaluation metrics computed from the env's (an offline learner's normalized score),
    logged with them."""
    counts: Callable[[Any], str] | None = None
    """``counts(config)``: what its progress (``env_steps``, which ``run.total_steps`` and the
    cadences count) counts, as a singular noun for summaries ("update" for an offline learner);
    None: "env step"."""

    def unit(self, config: Any) -> str:
        """What the progress of a run of ``config`` counts (see ``counts``)."""
        return "env step" if self.counts is None else self.counts(config)

    def scaling(self) -> dict[str, str | None]:
        """How it scales out, read from its declaration and its config, never from its name
        (the docs' table of which algorithm supports which): ``runners`` (``run.runners``),
        ``sampling ahead`` (the setting it reads for it, if any) and ``learners`` (its
        setting for several learners, if any), each the dotted setting or None."""
        config = self.default_config()
        unused = getattr(type(config), "UNUSED", {})

        def reads(*names: str) -> str | None:
            for name in names:
                try:
                    _dotted(config, name)
                except AttributeError:
                    continue
                if name not in unused:
                    return name
            return None

        return {
            "runners": "run.runners" if self.runners else None,
            "sampling ahead": reads("max_lag", "replay.max_lag"),
            "learners": "run.learners" if self.learner_groups else reads("num_learners"),
        }

    def default_config(self, **overrides: Any) -> Any:
        """The config this name starts from: ``config_cls()`` with ``defaults``, then
        ``overrides`` (dotted keys allowed)."""
        return replace(self.config_cls(), **{**self.defaults, **overrides})

    def matches(self, config: Any) -> bool:
        """``config`` is of this name's class (not a subclass: TD3+BC's config extends TD3's)
        and has every one of its default values."""
        return type(config) is self.config_cls and all(
            _dotted(config, key) == value for key, value in self.defaults.items()
        )


def _dotted(config: Any, key: str) -> Any:
    for part in key.split("."):
        config = getattr(config, part)
    return config


NUMPY_BACKENDS = ("auto", "torch", "numpy")
"""The learners with a NumPy path (`shoal.fast.backend`): PPO's (with MAPPO and IPPO) and A2C's."""
