"""Conservative Q-learning (Kumar et al. 2020, "Conservative Q-learning for offline
reinforcement learning", arXiv:2006.04779): SAC whose critics are also pushed down on
actions the dataset did not take and up on those it did, so that the policy does not chase
the over-estimated values of actions it has never seen.

CQL is `SACLearner` with a critic penalty passed in (`ConservativePenalty`), continuous and
discrete. The penalty, CQL(H), is ``weight * (log sum_a exp Q(s, a) - Q(s, a_data))``; with
continuous actions the log-sum-exp is estimated from uniformly random actions and the
policy's actions at ``s`` and ``s'`` (the paper's appendix F). ``weight`` is fixed
(``conservative_weight``), or tuned by dual gradient descent so that the gap stays near
``lagrange_threshold`` (CQL-Lagrange). SAC's entropy temperature is tuned automatically.
CQL continues online from its offline weights (``--online``).

It takes SAC's learner and config from the continuous-control family as parts it composes
(`shoal.algos.continuous.sac`: `SACLearner` with a `CriticPenalty` slot, built for this), and
no other internals of that family.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import torch
from torch import nn

from shoal.algos.continuous.sac import SACConfig, SACLearner, build_model
from shoal.algos.cores import offline as offline_core
from shoal.algos.cores.actor_critic_replay import ActorCriticCore
from shoal.algos.cores.offline import OfflineAlgorithm, OfflineConfig
from shoal.algos.spec import AlgorithmSpec
from shoal.config import check, check_positive
from shoal.core.device import resolve_device
from shoal.core.types import ReplayBatch
from shoal.envs.shapes import shape_of
from shoal.losses.offline import cql_logsumexp, cql_penalty, lagrange_loss


@dataclass(frozen=True)
class CQLConfig(OfflineConfig, SACConfig):
    """CQL's settings (the paper's MuJoCo ones: actor and temperature lr 1e-4, critic lr
    3e-4, 10 sampled actions); the SAC and offline settings are documented on `SACConfig` and
    `OfflineConfig`."""

    actor_lr: float | None = 1e-4
    """Actor learning rate (None: optim.lr)."""
    alpha_lr: float | None = 1e-4
    """Learning rate of SAC's log-temperature (None: optim.lr)."""
    conservative_weight: float = 5.0
    """The penalty's weight (the initial one with lagrange_threshold)."""
    lagrange_threshold: float | None = None
    """Tune the weight so that the penalty's gap stays near this (None: fixed weight)."""
    entropy_backup: bool = False
    """SAC's entropy term in the critics' target (the authors' CQL leaves it out)."""
    action_samples: int = 10
    """Continuous actions: random and policy actions sampled per state for the log-sum-exp."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive(self, "conservative_weight", "action_samples")
        if self.lagrange_threshold is not None:
            check(self, "lagrange_threshold", math.isfinite(self.lagrange_threshold),
                  "must be finite")  # fmt: skip


class ConservativePenalty:
    """CQL(H)'s critic penalty, a part of `SACLearner` (see `CriticPenalty`)."""

    def __init__(self, config: CQLConfig, action_space: gym.Space):
        self.config = config
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        self.action_dim = 0 if self.discrete else shape_of(action_space)[0]
        device = resolve_device(config.run.device)
        initial = math.log(config.conservative_weight)
        self.log_weight = nn.Parameter(torch.tensor(initial, device=device))

    def param_groups(self) -> list[tuple[list[nn.Parameter], float]]:
        if self.config.lagrange_threshold is None:
            return []
        return [([self.log_weight], self.config.optim.lr)]

    def __call__(
        self,
        core: ActorCriticCore,
        batch: ReplayBatch,
        data_q: torch.Tensor,
        all_q: torch.Tensor | None,
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        if all_q is not None:  # discrete actions: every action's Q-value
            soft_max = cql_logsumexp(all_q)
        else:
            soft_max = self._sampled_soft_max(core, batch)
        penalty = cql_penalty(soft_max, data_q)
        threshold = self.config.lagrange_threshold
        weight = self.log_weight.detach().exp().clamp(max=1e6)
        # The critics' loss here is 0.5 e^2, the authors' e^2: half the penalty keeps their
        # weights' meaning (5 for MuJoCo) for the sum of the two.
        losses = {"conservative": 0.5 * weight * (penalty - (threshold or 0.0))}
        if threshold is not None:
            losses["lagrange"] = lagrange_loss(self.log_weight, penalty, threshold)
        metrics = {"loss/conservative": penalty.detach(), "train/conservative_weight": weight}
        return losses, metrics

    def _sampled_soft_max(self, core: ActorCriticCore, batch: ReplayBatch) -> torch.Tensor:
        """``[M, N]`` log-sum-exp estimates of ``Q(s, .)`` from random actions (density
        ``2^-d`` on the unit box) and the policy's actions at ``s`` and at ``s'`` (their own
        densities), all valued at ``s``. The estimate is normalized by the number of samples,
        which the authors' code leaves out: a constant, so the same gradient."""
        k, n = self.config.action_samples, batch.obs.shape[0]
        with torch.no_grad():  # K actions per state from one forward pass each
            policy_actions, policy_log_prob = core.actor.sample_many(batch.obs, k)
            next_actions, next_log_prob = core.actor.sample_many(batch.next_obs, k)
        uniform = torch.rand_like(policy_actions) * 2 - 1
        uniform_log_prob = torch.full_like(policy_log_prob, -self.action_dim * math.log(2.0))
        # Every sample is valued at s, the next state's policy actions too (the authors' code),
        # in one batched pass of the critics: [N, 3K, d] actions, s repeated 3K times.
        actions = torch.cat([uniform, policy_actions, next_actions], dim=1)
        obs = batch.obs.repeat_interleave(3 * k, dim=0)
        q = core.critic(obs, actions.reshape(n * 3 * k, -1)).view(-1, n, 3 * k)
        log_density = torch.cat([uniform_log_prob, policy_log_prob, next_log_prob], dim=1)
        return cql_logsumexp(q, log_density)

    def state_dict(self) -> dict[str, Any]:
        return {"log_weight": self.log_weight.detach().clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with torch.no_grad():
            self.log_weight.copy_(state["log_weight"])


def cql_learner(config: CQLConfig, obs_space: gym.Space, action_space: gym.Space) -> SACLearner:
    return SACLearner(config, obs_space, action_space, ConservativePenalty(config, action_space))


class CQL(OfflineAlgorithm):
    def __init__(self, config: CQLConfig):
        super().__init__(config, cql_learner, build_model)


SPECS = (
    AlgorithmSpec(
        "cql",
        CQLConfig,
        CQL,
        build_model,
        "CQL: SAC with a conservative penalty on unseen actions (offline, then online)",
        "Box (bounded), Discrete",
        prepare=offline_core.prepare,
        counts=offline_core.counts,
        own_spaces=True,
        extra_evaluation=True,
        runners=True,
        learner_groups=True,
    ),
)
"""The names this module registers (`shoal.algos.spec`, `shoal.registry`)."""
