"""Return and advantage estimators over time-major rollouts.

Every tensor is time-major, ``[T, B, ...]``: time first, then batch (environments), then any
number of trailing dims (for example an agent axis). Only the time axis is looped over; the
rest is vectorized.

Episode ends are described by two flags, following the Gymnasium API:

* ``terminated[t]``: transition ``t`` reached a terminal state, whose value is zero by
  definition, so nothing is bootstrapped.
* ``truncated[t]``: the episode was cut off (time limit) after transition ``t``. The next
  state still has a value, so the target bootstraps from ``next_values[t]``, but the
  recursion must not run into ``t + 1``, which belongs to a new episode.

``next_values[t]`` is the critic's value of the true next state ``s_{t+1}`` of transition
``t``. At an episode end that is the final observation, not the first observation of the
reset episode; the caller is responsible for providing it.

The n-step helpers for replay (`n_step_return`, `bootstrap_discount`) work on the sample-major
windows of `shoal.core.types.ReplayBatch` instead: ``rewards [N, n]`` with ``steps [N]`` real steps.
"""

from __future__ import annotations

from typing import Any, NamedTuple, overload

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "bootstrap_discount",
    "discounted_returns",
    "episode_returns",
    "gae",
    "n_step_return",
    "retrace",
    "vtrace",
    "VTraceReturns",
]


def _check_time_major(name_to_tensor: dict[str, Tensor]) -> torch.Size:
    """Checks that all tensors share one ``[T, B, ...]`` shape with ``T >= 1``."""
    shapes = {name: t.shape for name, t in name_to_tensor.items()}
    first = next(iter(shapes.values()))
    if len(first) < 2 or first[0] == 0:
        raise ValueError(f"expected time-major tensors of shape [T, B, ...], got {dict(shapes)}")
    if any(shape != first for shape in shapes.values()):
        raise ValueError(f"all inputs must have the same shape, got {dict(shapes)}")
    return first


def discounted_returns(
    rewards: Tensor,
    next_values: Tensor,
    terminated: Tensor,
    truncated: Tensor,
    gamma: float,
) -> Tensor:
    """Bootstrapped discounted returns (Sutton & Barto 2018, Reinforcement Learning, ch. 3, 7).

    ``G_t = r_t + gamma * (1 - terminated_t) * X_t`` where ``X_t = next_values[t]`` if
    ``truncated_t`` or ``t == T - 1`` (bootstrap at a truncation and at the end of the rollout),
    else ``X_t = G_{t+1}``.

    Args:
        rewards: ``[T, B, ...]`` float rewards; the computation runs in this dtype.
        next_values: ``[T, B, ...]`` critic values of the next state of each transition.
        terminated: ``[T, B, ...]`` bool or float; 1 means no bootstrap at all.
        truncated: ``[T, B, ...]`` bool or float; 1 means bootstrap from ``next_values``.
        gamma: discount factor.

    Returns:
        ``[T, B, ...]`` returns in the dtype of ``rewards``.
    """
    shape = _check_time_major(
        {
            "rewards": rewards,
            "next_values": next_values,
            "terminated": terminated,
            "truncated": truncated,
        }
    )
    next_values = next_values.to(rewards.dtype)
    # Masks via torch.where rather than multiplication, so a non-finite placeholder value at a
    # masked-out position cannot leak into the result (0 * inf is nan).
    terminated = terminated.bool()
    truncated = truncated.bool()

    returns: list[Tensor] = []
    # The rollout's end behaves like a truncation: bootstrap from the critic.
    future = next_values[-1]
    for t in reversed(range(shape[0])):
        # A truncation restarts the recursion from the critic's estimate of s_{t+1}.
        future = torch.where(truncated[t], next_values[t], future)
        future = rewards[t] + torch.where(terminated[t], 0.0, gamma * future)
        returns.append(future)
    return torch.stack(returns[::-1])


@overload
def gae(
    rewards: np.ndarray,
    values: np.ndarray,
    next_values: np.ndarray,
    terminated: np.ndarray,
    truncated: np.ndarray,
    gamma: float,
    lam: float,
) -> tuple[np.ndarray, np.ndarray]: ...


@overload
def gae(
    rewards: Tensor,
    values: Tensor,
    next_values: Tensor,
    terminated: Tensor,
    truncated: Tensor,
    gamma: float,
    lam: float,
) -> tuple[Tensor, Tensor]: ...


def gae(
    rewards: Any,
    values: Any,
    next_values: Any,
    terminated: Any,
    truncated: Any,
    gamma: float,
    lam: float,
) -> Any:
    """Generalized advantage estimation (Schulman et al. 2016, arXiv:1506.02438).

    ``delta_t = r_t + gamma * (1 - terminated_t) * next_values_t - values_t`` and
    ``A_t = delta_t + gamma * lam * (1 - terminated_t) * (1 - truncated_t) * A_{t+1}``
    with ``A_T = 0``. ``lam = 1`` gives Monte-Carlo returns minus the baseline, ``lam = 0`` the
    one-step TD error.

    Takes torch tensors or NumPy arrays and returns the same kind. CPU tensors without a
    graph are computed on NumPy views of their memory: the recursion is a short loop of tiny
    steps, and a NumPy call costs a fraction of a tensor op's dispatch (same arithmetic).
    Tensors on an accelerator, or carrying a graph (values whose gradient a caller wants),
    stay in torch.

    Args:
        rewards: ``[T, B, ...]`` float rewards; the computation runs in this dtype.
        values: ``[T, B, ...]`` critic values of the state each transition starts from.
        next_values: ``[T, B, ...]`` critic values of the next state of each transition.
        terminated: ``[T, B, ...]`` bool or float episode-termination flags.
        truncated: ``[T, B, ...]`` bool or float episode-truncation flags.
        gamma: discount factor.
        lam: GAE trace-decay parameter lambda.

    Returns:
        ``(advantages, returns)``, both ``[T, B, ...]`` in the dtype of ``rewards``, with
        ``returns = advantages + values`` (the lambda-return, a target for the critic).
    """
    inputs = (rewards, values, next_values, terminated, truncated)
    names = ("rewards", "values", "next_values", "terminated", "truncated")
    _check_time_major(dict(zip(names, inputs, strict=True)))
    if isinstance(rewards, np.ndarray):
        return _gae_numpy(*inputs, gamma, lam)
    if rewards.device.type == "cpu" and not any(x.requires_grad for x in inputs):
        r, v, nv, term, trunc = (x.numpy() for x in inputs)
        advantages, returns = _gae_numpy(r, v, nv, term, trunc, gamma, lam)
        return torch.from_numpy(advantages), torch.from_numpy(returns)
    values = values.to(rewards.dtype)
    next_values = next_values.to(rewards.dtype)
    terminated = terminated.bool()
    # The trace must stop at any episode end, but only termination drops the bootstrap.
    done = terminated | truncated.bool()
    # All TD errors at once; only the recursion needs the loop. Masks via torch.where, so a
    # non-finite placeholder value at a masked-out position cannot leak (0 * inf is nan).
    deltas = rewards - values + torch.where(terminated, 0.0, gamma * next_values)
    decay = (~done).to(deltas.dtype) * (gamma * lam)
    steps: list[Tensor] = []
    future = torch.zeros_like(deltas[0])  # A_T = 0
    for t in reversed(range(len(deltas))):
        future = deltas[t] + decay[t] * future
        steps.append(future)
    adv = torch.stack(steps[::-1])
    return adv, adv + values


def _gae_numpy(
    rewards: np.ndarray,
    values: np.ndarray,
    next_values: np.ndarray,
    terminated: np.ndarray,
    truncated: np.ndarray,
    gamma: float,
    lam: float,
) -> tuple[np.ndarray, np.ndarray]:
    """`gae` on NumPy arrays, step for step the torch code above."""
    dtype = rewards.dtype
    values = values.astype(dtype, copy=False)
    terminated = terminated.astype(bool, copy=False)
    done = terminated | truncated.astype(bool, copy=False)
    bootstrap = np.where(terminated, 0.0, gamma * next_values.astype(dtype, copy=False))
    deltas = rewards - values + bootstrap.astype(dtype, copy=False)
    decay = np.where(done, 0.0, gamma * lam).astype(dtype)
    advantages = np.empty_like(deltas)
    future = 0.0  # A_T = 0
    for t in range(len(deltas) - 1, -1, -1):
        future = advantages[t] = deltas[t] + decay[t] * future
    return advantages, advantages + values


def n_step_return(rewards: Tensor, gamma: float) -> Tensor:
    """Discounted sum of an n-step reward window (Sutton 1988; Sutton & Barto 2018, ch. 7).

    ``G = sum_{k=0}^{n-1} gamma^k * r_k``. Replay zeroes the rewards after the episode's last
    step (see `shoal.core.types.ReplayBatch`), so a window of ``K < n`` real steps sums only those;
    the bootstrap term is added separately with `bootstrap_discount`.

    Args:
        rewards: ``[N, n, ...]`` float rewards of each window (trailing axes, e.g. one reward
            per agent, are kept); the computation runs in this dtype.
        gamma: discount factor.

    Returns:
        ``[N, ...]`` discounted reward sums.
    """
    if rewards.dim() < 2:
        raise ValueError(f"rewards must be [N, n, ...], got shape {tuple(rewards.shape)}")
    powers = gamma ** torch.arange(rewards.shape[1], dtype=rewards.dtype, device=rewards.device)
    return rewards.movedim(1, -1) @ powers


def bootstrap_discount(
    steps: Tensor, terminated: Tensor, gamma: float, dtype: torch.dtype | None = None
) -> Tensor:
    """Discount of the bootstrap value after an n-step window: ``gamma^K``, 0 if terminated.

    With `n_step_return` this gives the n-step target
    ``G + bootstrap_discount * V(s_{t+K})`` (Mnih et al. 2016, arXiv:1602.01783; Hessel et al.
    2018, arXiv:1710.02298). A truncated window (the episode hit its time limit, or the window
    is simply ``n`` steps long) keeps ``gamma^K``: its next state still has a value.

    Args:
        steps: ``[N]`` int number of real steps ``K`` in each window (``1..n``).
        terminated: ``[N]`` bool or float; the episode terminated within the window.
        gamma: discount factor.
        dtype: float dtype of the result; the default dtype when None.

    Returns:
        ``[N]`` discounts.
    """
    if steps.shape != terminated.shape:
        raise ValueError(
            f"steps and terminated must have the same shape, got {tuple(steps.shape)} "
            f"and {tuple(terminated.shape)}"
        )
    dtype = dtype or torch.get_default_dtype()
    discounts = gamma ** steps.to(dtype)
    return torch.where(terminated.bool(), torch.zeros_like(discounts), discounts)


def episode_returns(
    rewards: Tensor, terminated: Tensor, truncated: Tensor, gamma: float
) -> tuple[Tensor, Tensor]:
    """Monte-Carlo returns of complete episodes, no bootstrapping (Williams 1992, Machine
    Learning 8:229-256; Sutton & Barto 2018, ch. 5 and 13.3).

    ``G_t = r_t + gamma * (1 - done_t) * G_{t+1}`` with ``done = terminated | truncated`` and
    ``G_T = 0``. A truncation ends the episode like a termination: the return counts the rewards
    up to the cut and nothing after it. ``complete[t]`` says that the episode of transition
    ``t`` ends within the rollout (some ``done`` at a step ``>= t``), so ``G_t`` is its true
    return; where it is False, ``G_t`` only sums the rewards seen so far and must not be used as
    a return. Per environment the incomplete steps form a suffix of the time axis.

    Args:
        rewards: ``[T, B, ...]`` float rewards; the computation runs in this dtype.
        terminated: ``[T, B, ...]`` bool or float episode-termination flags.
        truncated: ``[T, B, ...]`` bool or float episode-truncation flags.
        gamma: discount factor.

    Returns:
        ``(returns, complete)``: ``[T, B, ...]`` returns in the dtype of ``rewards`` and a
        ``[T, B, ...]`` bool mask of the steps whose episode is complete.
    """
    shape = _check_time_major(
        {"rewards": rewards, "terminated": terminated, "truncated": truncated}
    )
    done = terminated.bool() | truncated.bool()
    returns: list[Tensor] = []
    complete: list[Tensor] = []
    future = torch.zeros_like(rewards[0])
    ended = torch.zeros_like(done[0])
    for t in reversed(range(shape[0])):
        future = rewards[t] + torch.where(done[t], 0.0, gamma * future)
        ended = ended | done[t]
        returns.append(future)
        complete.append(ended)
    return torch.stack(returns[::-1]), torch.stack(complete[::-1])


class VTraceReturns(NamedTuple):
    """What `vtrace` returns; both ``[T, B, ...]``, detached."""

    vs: Tensor
    """V-trace value targets ``v_s`` for the critic."""
    pg_advantages: Tensor
    """``rho_pg_s * (r_s + gamma * v_{s+1} - V(x_s))``, the policy-gradient advantages."""


def vtrace(
    behaviour_log_probs: Tensor,
    target_log_probs: Tensor,
    rewards: Tensor,
    values: Tensor,
    next_values: Tensor,
    terminated: Tensor,
    truncated: Tensor,
    gamma: float,
    clip_rho_threshold: float | None = 1.0,
    clip_c_threshold: float | None = 1.0,
    clip_pg_rho_threshold: float | None = 1.0,
    lam: float = 1.0,
) -> VTraceReturns:
    """V-trace off-policy value targets and advantages (Espeholt et al. 2018, arXiv:1802.01561,
    eq. 1 and section 4.2; DeepMind's scalable_agent ``vtrace.py``).

    With ``rho_t = min(rho_bar, pi(a_t|x_t) / mu(a_t|x_t))``, ``c_t = lam * min(c_bar,
    pi / mu)`` and ``delta_t = rho_t * (r_t + gamma * (1 - terminated_t) * next_values_t -
    values_t)``, the targets follow the recursion
    ``v_s - V(x_s) = delta_s + gamma * c_s * (1 - done_s) * (v_{s+1} - V(x_{s+1}))`` with
    ``done = terminated | truncated`` and ``v_T - V(x_T) = 0``: the trace stops at any episode
    end, and a truncation still bootstraps from the final observation's value through
    ``delta``. The advantages are
    ``rho_pg_s * (r_s + gamma * (1 - terminated_s) * X_s - values_s)`` with
    ``rho_pg_s = min(rho_pg_bar, pi / mu)`` and ``X_s = v_{s+1}``, or ``next_values_s`` at a
    truncation and at the rollout's last step. With ``pi = mu`` and ``lam = 1`` the targets
    are the on-policy n-step returns (`gae` with ``lam = 1``).

    Args:
        behaviour_log_probs: ``[T, B, ...]`` log mu(a_t|x_t) of the policy that acted.
        target_log_probs: ``[T, B, ...]`` log pi(a_t|x_t) of the policy being learned.
        rewards: ``[T, B, ...]`` float rewards; the computation runs in this dtype.
        values: ``[T, B, ...]`` critic values V(x_t) of the state each transition starts from.
        next_values: ``[T, B, ...]`` critic values of the true next state of each transition
            (the final observation at an episode end; V(x_T) at the rollout's end).
        terminated: ``[T, B, ...]`` bool or float episode-termination flags.
        truncated: ``[T, B, ...]`` bool or float episode-truncation flags.
        gamma: discount factor.
        clip_rho_threshold: rho-bar, clipping the ratios inside ``delta`` (None: no clip).
        clip_c_threshold: c-bar, clipping the trace coefficients (None: no clip).
        clip_pg_rho_threshold: clips the ratios weighting the advantages (None: no clip).
        lam: the paper's lambda (section 4.2), discounting the trace further.

    Returns:
        `VTraceReturns` ``(vs, pg_advantages)``, both ``[T, B, ...]``, without gradient.
    """
    shape = _check_time_major(
        {
            "behaviour_log_probs": behaviour_log_probs,
            "target_log_probs": target_log_probs,
            "rewards": rewards,
            "values": values,
            "next_values": next_values,
            "terminated": terminated,
            "truncated": truncated,
        }
    )
    with torch.no_grad():
        dtype = rewards.dtype
        rhos = torch.exp(target_log_probs.to(dtype) - behaviour_log_probs.to(dtype))
        values = values.to(dtype)
        next_values = next_values.to(dtype)
        terminated = terminated.bool()
        truncated = truncated.bool()
        done = terminated | truncated

        def clip(threshold: float | None) -> Tensor:
            return rhos if threshold is None else rhos.clamp(max=threshold)

        cs = lam * clip(clip_c_threshold)
        bootstrap = torch.where(terminated, 0.0, gamma * next_values)
        deltas = clip(clip_rho_threshold) * (rewards + bootstrap - values)
        corrections: list[Tensor] = []
        future = torch.zeros_like(deltas[0])  # v_T - V(x_T) = 0
        for t in reversed(range(shape[0])):
            future = deltas[t] + torch.where(done[t], 0.0, gamma * cs[t] * future)
            corrections.append(future)
        vs = torch.stack(corrections[::-1]) + values

        # v_{s+1}: the next step's target inside an episode, the critic's value of the next
        # state at a truncation and at the rollout's end (nothing later was seen).
        vs_next = torch.cat([vs[1:], next_values[-1:]])
        vs_next = torch.where(truncated, next_values, vs_next)
        pg_targets = rewards + torch.where(terminated, 0.0, gamma * vs_next)
        pg_advantages = clip(clip_pg_rho_threshold) * (pg_targets - values)
    return VTraceReturns(vs, pg_advantages)


def retrace(
    q_taken: Tensor,
    next_values: Tensor,
    rewards: Tensor,
    terminated: Tensor,
    truncated: Tensor,
    log_rhos: Tensor,
    gamma: float,
    lam: float = 1.0,
    clip_c_threshold: float | None = 1.0,
) -> Tensor:
    """Retrace(lambda) targets for Q (Munos, Stepleton, Harutyunyan and Bellemare 2016, "Safe
    and efficient off-policy reinforcement learning", arXiv:1606.02647, eq. 3 written as a
    recursion; ACER's ``Q_ret``, Wang et al. 2017, arXiv:1611.01224, eq. 5).

    With trace coefficients ``c_t = lam * min(c_bar, pi(a_t|x_t) / mu(a_t|x_t))``:
    ``G_t = r_t + gamma * (1 - terminated_t) * X_t``, where ``X_t = next_values[t]`` at a
    truncation and at the rollout's last step (nothing later is known), else
    ``X_t = next_values[t] + c_{t+1} * (G_{t+1} - q_taken[t+1])``. ``next_values[t]`` is
    ``E_{a ~ pi} Q(x_{t+1}, a)``: the expected-SARSA bootstrap that the trace corrects with the
    return actually observed after ``a_{t+1}``. The trace stops at any episode end: a
    termination bootstraps nothing, a truncation from the final observation's value. With
    ``c = 1`` (``pi = mu``, ``lam = 1``) and ``next_values[t] = q_taken[t + 1]`` these are the
    n-step SARSA returns (`discounted_returns`); with ``lam = 0`` the one-step expected-SARSA
    targets.

    Args:
        q_taken: ``[T, B, ...]`` ``Q(x_t, a_t)`` of the actions taken.
        next_values: ``[T, B, ...]`` ``E_pi Q(x_{t+1}, .)`` of the true next state of each
            transition (the final observation at an episode end).
        rewards: ``[T, B, ...]`` float rewards; the computation runs in this dtype.
        terminated: ``[T, B, ...]`` bool or float episode-termination flags.
        truncated: ``[T, B, ...]`` bool or float episode-truncation flags.
        log_rhos: ``[T, B, ...]`` ``log pi(a_t|x_t) - log mu(a_t|x_t)``.
        gamma: discount factor.
        lam: the trace-decay lambda.
        clip_c_threshold: c-bar, the truncation of the importance weights (None: no clip,
            which is unsafe: the variance is unbounded).

    Returns:
        ``[T, B, ...]`` targets, without gradient.
    """
    shape = _check_time_major(
        {
            "q_taken": q_taken,
            "next_values": next_values,
            "rewards": rewards,
            "terminated": terminated,
            "truncated": truncated,
            "log_rhos": log_rhos,
        }
    )
    with torch.no_grad():
        dtype = rewards.dtype
        rhos = torch.exp(log_rhos.to(dtype))
        cs = lam * (rhos if clip_c_threshold is None else rhos.clamp(max=clip_c_threshold))
        q_taken = q_taken.to(dtype)
        next_values = next_values.to(dtype)
        terminated = terminated.bool()
        truncated = truncated.bool()
        targets: list[Tensor] = []
        future = next_values[-1]  # the rollout's end bootstraps from the critic
        for t in reversed(range(shape[0])):
            if t < shape[0] - 1:
                corrected = next_values[t] + cs[t + 1] * (targets[-1] - q_taken[t + 1])
                future = torch.where(truncated[t], next_values[t], corrected)
            target = rewards[t] + torch.where(terminated[t], 0.0, gamma * future)
            targets.append(target)
    return torch.stack(targets[::-1])
