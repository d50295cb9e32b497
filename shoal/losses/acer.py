"""ACER's policy objective and trust region (Wang, Bapst, Heess, Mnih, Munos, Kavukcuoglu and
de Freitas 2017, "Sample efficient actor-critic with experience replay", arXiv:1611.01224).

The policy gradient of ACER (eq. 9, 14) is the gradient of a per-sample objective, maximized:
``min(c, rho_a) log pi(a) (Q_ret - V)``, the truncated importance-weighted term of the action
taken, plus the bias correction ``E_{b ~ pi}[ [1 - c / rho_b]_+ log pi(b) (Q(b) - V) ]`` over
actions of the current policy (``rho_b = pi(b) / mu(b)``), with the log-probabilities the only
differentiated factors. With discrete actions the expectation is the exact sum over actions
weighted by ``pi``; with continuous ones a single sample ``b ~ pi`` (weight 1). The trust
region (section 3.3) bounds the step of the policy's statistics ``phi`` against an average
policy network: the gradient ``g`` of this objective with respect to ``phi`` is projected onto
``k^T z <= delta`` with ``k`` the gradient of ``KL(pi_avg || pi)``, in closed form.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["acer_policy_objective", "trust_region_projection"]


def acer_policy_objective(
    log_pi_taken: Tensor,
    rho_taken: Tensor,
    advantage_taken: Tensor,
    log_pi_other: Tensor,
    rho_other: Tensor,
    advantage_other: Tensor,
    weight_other: Tensor,
    truncation: float,
) -> Tensor:
    """ACER's per-sample policy objective (to maximize); see the module docstring.

    Args:
        log_pi_taken: ``[N]`` ``log pi(a|x)`` of the action taken (differentiated).
        rho_taken: ``[N]`` ``pi(a|x) / mu(a|x)`` (no gradient).
        advantage_taken: ``[N]`` ``Q_ret - V(x)`` (no gradient).
        log_pi_other: ``[N, K]`` ``log pi(b|x)`` of the correction's actions (differentiated):
            every action (discrete) or ``K`` samples from ``pi`` (continuous).
        rho_other: ``[N, K]`` ``pi(b|x) / mu(b|x)`` (no gradient).
        advantage_other: ``[N, K]`` ``Q(x, b) - V(x)`` (no gradient).
        weight_other: ``[N, K]`` each action's weight in the expectation: ``pi(b|x)`` for the
            exact sum, ``1 / K`` for samples (no gradient).
        truncation: ``c``, the importance-weight truncation.

    Returns:
        ``[N]`` objective values.
    """
    rho_taken, advantage_taken = rho_taken.detach(), advantage_taken.detach()
    rho_other, advantage_other = rho_other.detach(), advantage_other.detach()
    truncated = rho_taken.clamp(max=truncation) * log_pi_taken * advantage_taken
    # [1 - c / rho]_+ : positive only where rho > c, the part the truncation cut off.
    correction_weight = (1.0 - truncation / rho_other).clamp(min=0.0)
    correction = weight_other.detach() * correction_weight * log_pi_other * advantage_other
    return truncated + correction.sum(-1)


def trust_region_projection(g: Tensor, k: Tensor, delta: float) -> Tensor:
    """``z* = g - max(0, (k^T g - delta) / ||k||^2) k`` per row: the closest direction to
    ``g`` whose first-order KL change ``k^T z`` is at most ``delta`` (Wang et al. 2017,
    eq. 12-13). ``g`` and ``k`` are ``[N, P]``; rows with ``k = 0`` keep ``g``."""
    if g.shape != k.shape:
        raise ValueError(f"g and k must have one shape, got {tuple(g.shape)} and {tuple(k.shape)}")
    excess = ((k * g).sum(-1) - delta).clamp(min=0.0)
    norm = (k * k).sum(-1)
    scale = torch.where(norm > 0, excess / norm.clamp(min=torch.finfo(g.dtype).tiny), 0.0)
    return g - scale.unsqueeze(-1) * k
