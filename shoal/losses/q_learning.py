"""Targets and losses of the value-based family: DQN, Double DQN, C51, QR-DQN, REM, Rainbow.

Inputs are sample-major, ``[N, ...]``, as replay hands them out (`shoal.core.types.ReplayBatch`).
The bootstrap is described by two ``[N]`` tensors built with `shoal.losses.returns`:
``returns`` (the discounted n-step reward sum, `n_step_return`) and ``discounts``
(``gamma^K``, zero at termination, `bootstrap_discount`), so a target is always
``returns + discounts * (value of the next state)``.

Targets are returned detached; losses return ``(scalar loss, per-sample values [N])`` with the
per-sample values detached, ready to be used as new replay priorities (Schaul et al. 2016,
arXiv:1511.05952; Hessel et al. 2018, arXiv:1710.02298).
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "categorical_projection",
    "categorical_td_loss",
    "combine_heads",
    "q_learning_target",
    "quantile_huber_loss",
    "quantile_midpoints",
    "quantile_target",
    "random_convex_combination",
    "masked_argmax",
    "td_loss",
]


def _check_shapes(expected: dict[str, tuple[Tensor | None, tuple[int, ...]]]) -> None:
    """Raises a ValueError naming the first tensor whose shape differs from the expected one."""
    for name, (tensor, shape) in expected.items():
        if tensor is not None and tuple(tensor.shape) != shape:
            raise ValueError(f"{name} must have shape {shape}, got {tuple(tensor.shape)}")


def _weighted_mean(per_sample: Tensor, weights: Tensor | None) -> Tensor:
    """``mean(weights * per_sample)``: importance-sampling correction of prioritized replay
    (Schaul et al. 2016, arXiv:1511.05952), whose weights the buffer already scales to max 1."""
    if weights is None:
        return per_sample.mean()
    _check_shapes({"weights": (weights, tuple(per_sample.shape))})
    return (weights.detach().to(per_sample.dtype) * per_sample).mean()


def q_learning_target(
    returns: Tensor,
    discounts: Tensor,
    next_q_target: Tensor,
    next_q_online: Tensor | None = None,
    next_action_mask: Tensor | None = None,
) -> Tensor:
    """n-step Q-learning target of DQN (Mnih et al. 2015, Nature 518), or of Double DQN
    (van Hasselt et al. 2016, arXiv:1509.06461) when ``next_q_online`` is given.

    DQN: ``y = G + d * max_a Q_target(s', a)``. Double DQN picks the action with the online
    network and evaluates it with the target network,
    ``y = G + d * Q_target(s', argmax_a Q_online(s', a))``, which removes the overestimation of
    taking a max over noisy estimates. Illegal actions (mask False) take part in neither the
    max nor the argmax. A row with no legal action at all (a terminal state of a multi-agent
    env, say) bootstraps from 0.

    Args:
        returns: ``[N]`` discounted n-step reward sums ``G``.
        discounts: ``[N]`` bootstrap discounts ``d`` (``gamma^K``, 0 when terminated).
        next_q_target: ``[N, A]`` target-network action values at ``s'``.
        next_q_online: ``[N, A]`` online-network action values at ``s'`` (Double DQN), or None.
        next_action_mask: ``[N, A]`` bool legal actions at ``s'``, or None (all legal).

    Returns:
        ``[N]`` detached targets in the dtype of ``next_q_target``.
    """
    n, a = next_q_target.shape
    _check_shapes(
        {
            "returns": (returns, (n,)),
            "discounts": (discounts, (n,)),
            "next_q_online": (next_q_online, (n, a)),
            "next_action_mask": (next_action_mask, (n, a)),
        }
    )
    with torch.no_grad():
        selector = next_q_target if next_q_online is None else next_q_online
        if next_action_mask is not None:
            selector = selector.masked_fill(~next_action_mask.bool(), float("-inf"))
        action = selector.argmax(dim=-1, keepdim=True)
        next_value = next_q_target.gather(-1, action).squeeze(-1)
        if next_action_mask is not None:
            # torch.where, not a product: the gathered value may be anything when no action is
            # legal, and 0 * inf would be nan.
            any_legal = next_action_mask.bool().any(dim=-1)
            next_value = torch.where(any_legal, next_value, torch.zeros_like(next_value))
        return returns.to(next_value.dtype) + discounts.to(next_value.dtype) * next_value


def td_loss(
    q_taken: Tensor,
    target: Tensor,
    weights: Tensor | None = None,
    kind: Literal["huber", "mse"] = "huber",
    huber_delta: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """Importance-weighted TD regression loss of DQN (Mnih et al. 2015, Nature 518).

    Per sample ``l = huber_delta(q - y)`` (``0.5 e^2`` inside ``|e| <= delta``, linear
    beyond, so the gradient is the error clipped to ``[-delta, delta]``, the "error clipping"
    of the Nature paper) or ``l = 0.5 (q - y)^2`` for ``"mse"``; the loss is
    ``mean(weights * l)``.

    Args:
        q_taken: ``[N]`` online Q-values of the actions taken.
        target: ``[N]`` targets, e.g. from `q_learning_target` (detached here).
        weights: ``[N]`` importance-sampling weights, or None for a plain mean.
        kind: ``"huber"`` or ``"mse"``.
        huber_delta: where the Huber loss turns from quadratic to linear.

    Returns:
        ``(loss, td_errors)``: the scalar loss and the detached ``[N]`` TD errors
        ``target - q_taken`` (their absolute values are the usual new priorities).
    """
    _check_shapes({"target": (target, tuple(q_taken.shape))})
    target = target.detach().to(q_taken.dtype)
    if kind == "huber":
        # shoal.losses.value.huber_loss is the same function but already reduced to a mean;
        # the importance weights need it per sample.
        per_sample = F.huber_loss(q_taken, target, reduction="none", delta=huber_delta)
    elif kind == "mse":
        per_sample = 0.5 * (q_taken - target).pow(2)
    else:
        raise ValueError(f"kind must be 'huber' or 'mse', got {kind!r}")
    return _weighted_mean(per_sample, weights), (target - q_taken).detach()


def categorical_projection(
    next_probs: Tensor, support: Tensor, returns: Tensor, discounts: Tensor
) -> Tensor:
    """Projection of the distributional Bellman target onto a fixed support (C51, Bellemare
    et al. 2017, arXiv:1707.06887, Algorithm 1).

    Each atom ``z_j`` of the next-state distribution moves to ``Tz_j = G + d * z_j``, clipped to
    ``[v_min, v_max]``, and its probability is split between the two neighbouring atoms of the
    support in proportion to closeness. Mass beyond the edges lands on the edge atoms, so every
    row of the result sums to the same total as its row of ``next_probs``.

    Args:
        next_probs: ``[N, atoms]`` probabilities of the next state-action distribution (the
            target network's, at the action chosen for the bootstrap).
        support: ``[atoms]`` evenly spaced atom values ``v_min .. v_max`` (``atoms >= 2``).
        returns: ``[N]`` discounted n-step reward sums ``G``.
        discounts: ``[N]`` bootstrap discounts ``d`` (0 when terminated).

    Returns:
        ``[N, atoms]`` detached target probabilities in the dtype of ``next_probs``.
    """
    n, atoms = next_probs.shape
    if atoms < 2:
        raise ValueError(f"the support needs at least 2 atoms, got {atoms}")
    _check_shapes(
        {"support": (support, (atoms,)), "returns": (returns, (n,)), "discounts": (discounts, (n,))}
    )
    with torch.no_grad():
        dtype = next_probs.dtype
        support = support.to(dtype)
        v_min, v_max = support[0], support[-1]
        delta_z = (v_max - v_min) / (atoms - 1)
        tz = returns.to(dtype).unsqueeze(-1) + discounts.to(dtype).unsqueeze(-1) * support
        # Fractional atom index of each moved atom; the clamp also absorbs rounding past the
        # last index.
        b = ((tz.clamp(v_min, v_max) - v_min) / delta_z).clamp(0, atoms - 1)
        # Taking the lower neighbour as floor(b) capped at atoms - 2 means u = l + 1 always:
        # a Tz exactly on an atom gives weight 1 to that atom (lower, or upper at v_max), where
        # Algorithm 1's l = floor(b), u = ceil(b) would give both weights 0 and lose the mass.
        lower = b.floor().clamp(max=atoms - 2)
        upper_weight = b - lower
        lower = lower.long()
        projected = torch.zeros_like(next_probs)
        projected.scatter_add_(-1, lower, next_probs * (1.0 - upper_weight))
        projected.scatter_add_(-1, lower + 1, next_probs * upper_weight)
        return projected


def categorical_td_loss(
    logits_taken: Tensor, target_probs: Tensor, weights: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Cross-entropy between the projected target and the predicted distribution (C51,
    Bellemare et al. 2017, arXiv:1707.06887, Algorithm 1; the KL of the paper up to a constant).

    Args:
        logits_taken: ``[N, atoms]`` online logits of the actions taken.
        target_probs: ``[N, atoms]`` target probabilities, e.g. from `categorical_projection`
            (detached here).
        weights: ``[N]`` importance-sampling weights, or None for a plain mean.

    Returns:
        ``(loss, cross_entropy)``: the scalar loss ``mean(weights * ce)`` and the detached
        ``[N]`` per-sample cross-entropies, which Rainbow (Hessel et al. 2018,
        arXiv:1710.02298) uses as priorities.
    """
    _check_shapes({"target_probs": (target_probs, tuple(logits_taken.shape))})
    log_probs = F.log_softmax(logits_taken, dim=-1)
    cross_entropy = -(target_probs.detach().to(log_probs.dtype) * log_probs).sum(dim=-1)
    return _weighted_mean(cross_entropy, weights), cross_entropy.detach()


def quantile_midpoints(
    num_quantiles: int, dtype: torch.dtype | None = None, device: torch.device | str | None = None
) -> Tensor:
    """Quantile midpoints ``tau_i = (2i + 1) / (2Q)``, ``i = 0..Q-1``, the fractions whose
    quantiles minimize the 1-Wasserstein distance (Dabney et al. 2018, arXiv:1710.10044,
    Lemma 2). Returns a ``[Q]`` tensor."""
    if num_quantiles < 1:
        raise ValueError(f"num_quantiles must be >= 1, got {num_quantiles}")
    i = torch.arange(num_quantiles, dtype=dtype or torch.get_default_dtype(), device=device)
    return (2 * i + 1) / (2 * num_quantiles)


def quantile_target(returns: Tensor, discounts: Tensor, next_quantiles: Tensor) -> Tensor:
    """Target quantiles ``G + d * theta_j(s', a*)`` of QR-DQN (Dabney et al. 2018,
    arXiv:1710.10044, Algorithm 1).

    Args:
        returns: ``[N]`` discounted n-step reward sums ``G``.
        discounts: ``[N]`` bootstrap discounts ``d`` (0 when terminated).
        next_quantiles: ``[N, Q]`` target-network quantiles at the bootstrap action ``a*``.

    Returns:
        ``[N, Q]`` detached target samples in the dtype of ``next_quantiles``.
    """
    n = next_quantiles.shape[0]
    _check_shapes({"returns": (returns, (n,)), "discounts": (discounts, (n,))})
    dtype = next_quantiles.dtype
    target = returns.to(dtype).unsqueeze(-1) + discounts.to(dtype).unsqueeze(-1) * next_quantiles
    return target.detach()


def quantile_huber_loss(
    pred: Tensor,
    target: Tensor,
    taus: Tensor,
    kappa: float = 1.0,
    weights: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Quantile Huber loss of QR-DQN (Dabney et al. 2018, arXiv:1710.10044, section 4 and
    Algorithm 1).

    With pairwise errors ``u_ij = target_j - pred_i`` and the Huber loss ``L_kappa``,
    ``rho_i(u) = |tau_i - 1{u < 0}| * L_kappa(u)`` and the per-sample loss is
    ``sum_i mean_j rho_i(u_ij)``. As in the QR-DQN paper there is no division by ``kappa``
    (IQN, Dabney et al. 2018b, adds one); both agree at the usual ``kappa = 1``.

    Args:
        pred: ``[N, Q]`` online quantiles of the actions taken.
        target: ``[N, Q']`` target samples, e.g. from `quantile_target` (detached here).
        taus: ``[Q]`` quantile fractions of ``pred``, e.g. `quantile_midpoints`.
        kappa: Huber threshold, ``> 0``.
        weights: ``[N]`` importance-sampling weights, or None for a plain mean.

    Returns:
        ``(loss, per_sample)``: the scalar loss ``mean(weights * per_sample)`` and the
        detached ``[N]`` per-sample losses.
    """
    n, q = pred.shape
    if target.dim() != 2 or target.shape[0] != n:
        raise ValueError(f"target must have shape ({n}, Q'), got {tuple(target.shape)}")
    _check_shapes({"taus": (taus, (q,))})
    if kappa <= 0:
        raise ValueError(f"kappa must be > 0, got {kappa}")
    # [N, Q, Q']: predicted quantile i against target sample j.
    u = target.detach().to(pred.dtype).unsqueeze(-2) - pred.unsqueeze(-1)
    huber = F.huber_loss(u, torch.zeros_like(u), reduction="none", delta=kappa)
    # The indicator is a step function: no gradient flows through it.
    asymmetry = (taus.to(pred.dtype).unsqueeze(-1) - (u < 0).to(pred.dtype)).abs()
    per_sample = (asymmetry * huber).mean(dim=-1).sum(dim=-1)
    return _weighted_mean(per_sample, weights), per_sample.detach()


def random_convex_combination(
    num_heads: int,
    batch: int | None = None,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> Tensor:
    """Random convex weights over ``K`` Q-heads, for REM (Agarwal et al. 2020,
    arXiv:1907.04543, section 4.2): ``alpha_k = a_k / sum_j a_j`` with ``a_k ~ U(0, 1)``.

    The paper draws one ``alpha`` per minibatch (``batch=None``, shape ``[K]``); ``batch=N``
    draws one per sample (``[N, K]``).

    Args:
        num_heads: number of heads ``K``.
        batch: None for one vector, or the number of independent vectors.
        generator: torch generator to draw from (the global one when None).
        device: device of the result (must match the generator's).

    Returns:
        ``[K]`` or ``[batch, K]`` weights, non-negative, summing to 1 over the last axis.
    """
    if num_heads < 1:
        raise ValueError(f"num_heads must be >= 1, got {num_heads}")
    shape = (num_heads,) if batch is None else (batch, num_heads)
    draws = torch.rand(shape, generator=generator, device=device)
    return draws / draws.sum(dim=-1, keepdim=True)


def combine_heads(q_heads: Tensor, alphas: Tensor) -> Tensor:
    """Convex combination ``sum_k alpha_k Q_k(s, a)`` of REM (Agarwal et al. 2020,
    arXiv:1907.04543, section 4.2). Use the same ``alphas`` for the online and the target heads.

    Args:
        q_heads: ``[N, A, K]`` Q-values of ``K`` heads (the last axis of `shoal.nn.QHead`).
        alphas: ``[K]`` one weight vector for the batch, or ``[N, K]`` one per sample.

    Returns:
        ``[N, A]`` combined Q-values.
    """
    n, _, k = q_heads.shape
    if tuple(alphas.shape) not in ((k,), (n, k)):
        raise ValueError(f"alphas must have shape ({k},) or ({n}, {k}), got {tuple(alphas.shape)}")
    alphas = alphas.to(q_heads.dtype)
    if alphas.dim() == 2:
        alphas = alphas.unsqueeze(-2)
    return (q_heads * alphas).sum(dim=-1)


def masked_argmax(q: Tensor, mask: Tensor | None) -> Tensor:
    """``argmax`` over the last axis of ``q``, among the legal actions where ``mask`` (same
    shape, bool) is given."""
    if mask is not None:
        q = q.masked_fill(~mask, float("-inf"))
    return q.argmax(dim=-1)
