"""The objectives of the on-policy actor-critics (PPO, A2C): weighted sums of loss terms, each
giving its loss and its gradient with respect to the network's outputs.

An actor-critic reaches these losses only through three per-sample outputs (`PolicyOutputs`):
the log-probability of the taken action, the policy's entropy and the value. An `Objective`
is ``sum_k coef_k * term_k``, each term reading one output and constants of the batch
(`Targets`). It evaluates the terms (`Objective.losses`: the values logged, and under autograd
the graph to differentiate) and the gradient of the total with respect to the outputs
(`Objective.gradients`, which the fast path carries through the network by hand,
`shoal.fast`). Both come from the same term objects, whose arithmetic is the one definition of
each loss in `shoal.losses.policy_gradient` and `shoal.losses.value` (on tensors or NumPy
arrays alike), so a term added to an objective is trained and reported the same way on either
backend. ``tests/losses/test_objectives.py`` checks every term's gradient against autograd.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple, Protocol

from shoal.losses.arrays import Array, constant, count
from shoal.losses.policy_gradient import (
    entropy_loss,
    entropy_loss_grad,
    kl_penalty_loss,
    kl_penalty_loss_grad,
    policy_gradient_loss,
    policy_gradient_loss_grad,
    ppo_clip_loss,
    ppo_clip_loss_grad,
)
from shoal.losses.value import (
    clipped_value_loss,
    clipped_value_loss_grad,
    value_loss,
    value_loss_grad,
)

__all__ = [
    "ClippedSurrogate",
    "EntropyBonus",
    "KLPenalty",
    "Objective",
    "PolicyGradient",
    "PolicyOutputs",
    "Targets",
    "ValueRegression",
    "a2c_objective",
    "ppo_objective",
    "standardize",
]


class PolicyOutputs(NamedTuple):
    """An actor-critic's per-sample outputs that the on-policy losses read, ``[N]`` each (or
    the gradients with respect to them, None where no term reads one)."""

    log_prob: Any
    """Log-probability of the taken action under the current policy."""
    entropy: Any
    """Entropy of the current policy's action distribution."""
    values: Any
    """The critic's value of the observation."""


class Targets(NamedTuple):
    """The constants the outputs are compared with, ``[N]`` each."""

    old_log_prob: Any
    """Log-probability of the taken action under the policy that sampled it."""
    old_values: Any
    """The sampling critic's values (for the clipped value loss)."""
    advantages: Any
    """Advantages, standardized when the objective says so."""
    returns: Any
    """Value targets."""


class Term(Protocol):
    """One loss term: ``loss`` and ``grad`` of the output named ``reads``."""

    name: ClassVar[str]
    """The metric name: ``loss/<name>``."""
    reads: ClassVar[str]
    """The `PolicyOutputs` field the term is a function of."""

    def loss(self, x: Array, targets: Targets) -> tuple[Array, dict[str, Array]]:
        """The scalar loss and diagnostics (detached)."""
        ...

    def grad(self, x: Array, targets: Targets) -> Array:
        """``d loss / d x``, shaped like ``x``."""
        ...


@dataclass(frozen=True)
class ClippedSurrogate:
    """PPO's clipped surrogate (`ppo_clip_loss`); diagnostics ``approx_kl``,
    ``clip_fraction`` and ``ratio_mean``."""

    clip_eps: float
    name: ClassVar[str] = "policy"
    reads: ClassVar[str] = "log_prob"

    def loss(self, x: Array, targets: Targets) -> tuple[Array, dict[str, Array]]:
        return ppo_clip_loss(x, targets.old_log_prob, targets.advantages, self.clip_eps)

    def grad(self, x: Array, targets: Targets) -> Array:
        return ppo_clip_loss_grad(x, targets.old_log_prob, targets.advantages, self.clip_eps)


@dataclass(frozen=True)
class PolicyGradient:
    """The score-function policy gradient (`policy_gradient_loss`) of A2C."""

    name: ClassVar[str] = "policy"
    reads: ClassVar[str] = "log_prob"

    def loss(self, x: Array, targets: Targets) -> tuple[Array, dict[str, Array]]:
        return policy_gradient_loss(x, targets.advantages), {}

    def grad(self, x: Array, targets: Targets) -> Array:
        return policy_gradient_loss_grad(x, targets.advantages)


@dataclass(frozen=True)
class ValueRegression:
    """The critic's squared error (`value_loss`), or with ``clip`` the clipped value loss of
    OpenAI Baselines' PPO2 (`clipped_value_loss`)."""

    clip: float | None = None
    name: ClassVar[str] = "value"
    reads: ClassVar[str] = "values"

    def loss(self, x: Array, targets: Targets) -> tuple[Array, dict[str, Array]]:
        if self.clip is None:
            return value_loss(x, targets.returns), {}
        return clipped_value_loss(x, targets.old_values, targets.returns, self.clip), {}

    def grad(self, x: Array, targets: Targets) -> Array:
        if self.clip is None:
            return value_loss_grad(x, targets.returns)
        return clipped_value_loss_grad(x, targets.old_values, targets.returns, self.clip)


@dataclass(frozen=True)
class EntropyBonus:
    """The entropy bonus as a loss (`entropy_loss`, ``-mean(H)``)."""

    name: ClassVar[str] = "entropy"
    reads: ClassVar[str] = "entropy"

    def loss(self, x: Array, targets: Targets) -> tuple[Array, dict[str, Array]]:
        return entropy_loss(x), {}

    def grad(self, x: Array, targets: Targets) -> Array:
        return entropy_loss_grad(x)


@dataclass(frozen=True)
class KLPenalty:
    """PPO's sample-based KL penalty ``coeff * mean(log old - log new)`` (`kl_penalty_loss`),
    unbiased for KL(old || new) on samples of the old policy."""

    coeff: float
    name: ClassVar[str] = "kl"
    reads: ClassVar[str] = "log_prob"

    def loss(self, x: Array, targets: Targets) -> tuple[Array, dict[str, Array]]:
        return kl_penalty_loss(constant(targets.old_log_prob) - x, self.coeff), {}

    def grad(self, x: Array, targets: Targets) -> Array:
        return kl_penalty_loss_grad(x, self.coeff)


def standardize(x: Array) -> Array:
    """``(x - mean) / (std + 1e-8)`` with the unbiased standard deviation; a single element
    is returned as it is (it has no spread to divide by)."""
    n = count(x)
    if n < 2:
        return x
    centered = x - x.mean()
    std = ((centered * centered).sum() / (n - 1)) ** 0.5
    return centered / (std + 1e-8)


class Objective:
    """``sum_k coef_k * term_k`` over `PolicyOutputs`; see the module docstring.

    Terms with a zero weight are evaluated and logged but take no part in the total and its
    gradient (an entropy bonus of weight 0 still reports the entropy)."""

    def __init__(self, terms: Sequence[tuple[float, Term]], normalize_advantages: bool = False):
        names = [term.name for _, term in terms]
        if len(set(names)) != len(names):
            raise ValueError(f"an objective's terms need distinct names, got {names}")
        if not any(coef for coef, _ in terms):
            raise ValueError("an objective needs a term with a non-zero weight")
        self.terms = tuple(terms)
        self.normalize_advantages = normalize_advantages

    def targets(self, batch: Any) -> Targets:
        """The constants of a batch with fields ``log_probs``, ``values``, ``advantages`` and
        ``returns`` (a `shoal.algos.cores.rollout_batch.RolloutBatch`), advantages standardized as
        set."""
        advantages = batch.advantages
        if self.normalize_advantages:
            advantages = standardize(advantages)
        return Targets(batch.log_probs, batch.values, advantages, batch.returns)

    def losses(
        self, out: PolicyOutputs, targets: Targets
    ) -> tuple[dict[str, Array], dict[str, Array]]:
        """The terms by name and their weighted ``total`` (last), and the terms'
        diagnostics."""
        losses: dict[str, Array] = {}
        stats: dict[str, Array] = {}
        total: Any = None
        for coef, term in self.terms:
            loss, term_stats = term.loss(getattr(out, term.reads), targets)
            losses[term.name] = loss
            stats.update(term_stats)
            if coef:
                weighted = loss if coef == 1.0 else coef * loss
                total = weighted if total is None else total + weighted
        losses["total"] = total
        return losses, stats

    def gradients(self, out: PolicyOutputs, targets: Targets) -> PolicyOutputs:
        """``d total / d out``, one entry per output (None where no weighted term reads it)."""
        grads: dict[str, Any] = dict.fromkeys(PolicyOutputs._fields)  # arrays, or None
        for coef, term in self.terms:
            if not coef:
                continue
            grad = term.grad(getattr(out, term.reads), targets)
            if coef != 1.0:
                grad = grad * coef
            previous = grads[term.reads]
            grads[term.reads] = grad if previous is None else previous + grad
        return PolicyOutputs(**grads)


def ppo_objective(
    clip_eps: float,
    vf_coef: float,
    ent_coef: float,
    value_clip: float | None = None,
    kl_coeff: float = 0.0,
    normalize_advantages: bool = True,
) -> Objective:
    """PPO (Schulman et al. 2017, arXiv:1707.06347): clipped surrogate + ``vf_coef`` x value
    loss (clipped with ``value_clip``) + ``ent_coef`` x entropy loss, plus the adaptive KL
    penalty's term when ``kl_coeff`` > 0."""
    terms: list[tuple[float, Term]] = [
        (1.0, ClippedSurrogate(clip_eps)),
        (vf_coef, ValueRegression(value_clip)),
        (ent_coef, EntropyBonus()),
    ]
    if kl_coeff > 0:
        terms.append((1.0, KLPenalty(kl_coeff)))
    return Objective(terms, normalize_advantages)


def a2c_objective(vf_coef: float, ent_coef: float, normalize_advantages: bool = False) -> Objective:
    """A2C (Mnih et al. 2016, arXiv:1602.01783, Algorithm S3): policy gradient + ``vf_coef``
    x value loss + ``ent_coef`` x entropy loss."""
    terms: list[tuple[float, Term]] = [
        (1.0, PolicyGradient()),
        (vf_coef, ValueRegression()),
        (ent_coef, EntropyBonus()),
    ]
    return Objective(terms, normalize_advantages)
