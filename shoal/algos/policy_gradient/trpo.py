"""Trust Region Policy Optimization (Schulman et al. 2015, arXiv:1502.05477).

Each iteration takes one natural-gradient step on the surrogate objective: the step direction
solves ``F s = g`` by conjugate gradient on Fisher-vector products (double backprop of the mean
KL), is scaled to the trust region ``0.5 s^T F s = max_kl`` and shrunk by a backtracking line
search until the sampled KL and surrogate improvement hold. The value function is fitted
separately by Adam regression on GAE returns, as in the paper's successors (GAE, Schulman et
al. 2016, arXiv:1506.02438, which TRPO implementations follow).
"""

from __future__ import annotations

import copy
import functools
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import gymnasium as gym
import torch

from shoal.algos.cores.group_shares import RankRows, WholeBatch
from shoal.algos.cores.learner_group import LearnerGroup
from shoal.algos.cores.on_policy import ModelLearner, OnPolicyCore, held
from shoal.algos.cores.rollout_batch import RolloutBatch, make_batch
from shoal.algos.spec import AlgorithmSpec
from shoal.config import EnvConfig, ModelConfig, RunConfig, check, check_positive
from shoal.config.usage import NO_LSTM, OWN_GAMMA
from shoal.core.device import resolve_device, to_device
from shoal.core.errors import NaNLossError
from shoal.fast.backend import place
from shoal.losses import (
    conjugate_gradient,
    fisher_vector_product,
    flat_concat,
    flat_grad,
    set_flat_params,
    value_loss,
)
from shoal.nn import ActorCritic
from shoal.nn.policy import ActorPolicy
from shoal.optim import build_optimizer


@dataclass(frozen=True)
class TRPOConfig:
    """TRPO hyperparameters. The defaults are the paper's and OpenAI Baselines' (max_kl 0.01,
    10 CG iterations, damping 0.1), with the trust region measured per action dimension
    (``kl_per_action_dim``); the tuned examples hold faster settings."""

    run: RunConfig = field(default_factory=RunConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    num_steps: int = 256
    """Steps per environment in each rollout (rollout size = num_steps * env.num_envs, times
    run.runners with Ray runners)."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.95
    """GAE lambda: 0 is one-step TD, 1 is Monte-Carlo."""
    max_kl: float = 0.01
    """Trust-region size: the largest mean KL(old || new) a policy step may take (per action
    dimension with kl_per_action_dim)."""
    kl_per_action_dim: bool = True
    """Measure the trust region per action dimension: the KL of a policy over d action
    dimensions (a d-dimensional Gaussian, d sub-actions; d = 1 for Discrete) is divided by d,
    for the step's size (max_kl) and its Fisher matrix (so cg_damping weighs d times more).
    Each dimension may then move as far as a one-dimensional policy's; sb3-contrib's TRPO
    measures a Gaussian's KL so (as the mean over dimensions). False: the paper's KL of the
    whole action, which on HalfCheetah's 6 dimensions takes steps too small to learn in 200k
    env steps (benchmarks/README.md, "defaults.py")."""
    cg_iters: int = 10
    """Conjugate-gradient iterations (Fisher-vector products) per step direction."""
    cg_damping: float = 0.1
    """Added to the Fisher matrix's diagonal, so the system stays well conditioned."""
    cg_residual_tol: float = 1e-10
    """Stop conjugate gradient early once the squared residual norm is below this."""
    line_search_steps: int = 10
    """Halvings of the step the backtracking line search tries before keeping the old policy."""
    normalize_advantages: bool = True
    """Standardize advantages over the rollout."""
    vf_lr: float = 1e-3
    """Adam learning rate of the value-function regression."""
    vf_epochs: int = 5
    """Passes of minibatch Adam over each rollout for the value function."""
    vf_minibatch_size: int = 256
    """Samples per value-function gradient step."""
    vf_max_grad_norm: float | None = 0.5
    """Clip the value function's gradient norm to this value (None disables)."""

    UNUSED: ClassVar[dict[str, str]] = {**OWN_GAMMA, **NO_LSTM}

    def __post_init__(self) -> None:
        check_positive(self, "num_steps", "max_kl", "cg_iters", "line_search_steps")
        check_positive(self, "vf_lr", "vf_epochs", "vf_minibatch_size")
        check(self, "gamma", 0.0 <= self.gamma <= 1.0, "must be in [0, 1]")
        check(self, "gae_lambda", 0.0 <= self.gae_lambda <= 1.0, "must be in [0, 1]")
        check(self, "cg_damping", self.cg_damping >= 0, "must be >= 0")
        check(self, "cg_residual_tol", self.cg_residual_tol >= 0, "must be >= 0")
        rollout = self.num_steps * self.env.num_envs * max(1, self.run.runners)
        check(
            self,
            "vf_minibatch_size",
            self.vf_minibatch_size <= rollout,
            f"must be <= num_steps * env.num_envs (* run.runners) = {rollout}",
        )
        # The policy step and the value regression must move disjoint parameters: a shared
        # trunk would let each undo the other (and break the trust region's KL bound).
        check(self, "model", not self.model.shared_trunk, "TRPO needs shared_trunk: false")
        check(
            self.model,
            "precision",
            self.model.precision != "float16",
            "TRPO's conjugate-gradient step has no gradient scaler; use float32 or bfloat16",
        )
        if self.vf_max_grad_norm is not None:
            check_positive(self, "vf_max_grad_norm")


def build_model(config: TRPOConfig, obs_space: gym.Space, action_space: gym.Space) -> ActorCritic:
    return ActorCritic(obs_space, action_space, config.model)


class TRPOLearner(ModelLearner[ActorCritic]):
    """Owns the actor-critic, a natural-gradient policy step and the value optimizer.

    The separate actor and critic encoders live in one stacked `ParallelMLP` tensor per layer,
    so both parameter lists hold the body. That is safe: the policy's gradient and Fisher
    products are exactly zero on the critic's slices (so is the CG step there), and the
    value loss's gradient is exactly zero on the actor's, which Adam leaves untouched.
    """

    def __init__(self, config: TRPOConfig, obs_space: gym.Space, action_space: gym.Space):
        self.config = config
        model = build_model(config, obs_space, action_space)
        self.device = resolve_device(config.run.device)
        self.model = place(model, self.device, config.run.compile)
        body = list(self.model.body.parameters())
        self.policy_params = body + list(self.model.policy_head.parameters())
        self.value_params = body + list(self.model.value_head.parameters())
        self.vf_optimizer = build_optimizer(self.value_params, "adam", config.vf_lr, eps=1e-5)
        self.part: WholeBatch | RankRows = WholeBatch()
        """How it takes a batch, a part: all of it, or a learner group's rank's rows, the
        whole batch's means all-reduced (`TRPOShare`)."""

    def update(self, batch: RolloutBatch) -> dict[str, float]:
        batch = to_device(batch, self.device)
        metrics = self.update_policy(batch)
        metrics.update(self.update_value(batch))
        return metrics

    def _surrogate(self, dist: Any, batch: RolloutBatch, advantages: torch.Tensor) -> torch.Tensor:
        """The importance-sampled surrogate ``E[pi/pi_old * A]`` (TRPO eq. 14), to maximize."""
        return (torch.exp(dist.log_prob(batch.actions) - batch.log_probs) * advantages).mean()

    def update_policy(self, batch: RolloutBatch) -> dict[str, float]:
        """The natural-gradient step. Every mean over the batch (the surrogate, its gradient,
        the Fisher-vector products, the line search's KL and gain) is ``mean`` of one over
        the rows taken: the whole batch's, in a learner group too."""
        cfg = self.config
        if cfg.normalize_advantages:  # over the whole batch, before a rank takes its rows
            advantages = batch.advantages
            advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
            batch = batch._replace(advantages=advantages)
        batch = self.part.rows(batch)
        mean = self.part.mean
        # Action dimensions: the columns of an action ([N] for Discrete: one).
        dims = batch.actions[0].numel() if cfg.kl_per_action_dim else 1
        dist = self.model.distribution(batch.obs, batch.action_mask)  # masked where given
        with torch.no_grad():
            old_dist = _frozen(self.model.distribution(batch.obs, batch.action_mask))
        surrogate = self._surrogate(dist, batch, batch.advantages)
        kl = old_dist.kl(dist).mean() / dims
        before = mean(surrogate).item()
        if not math.isfinite(before):  # the same on every rank of a group: all stop
            raise NaNLossError(f"loss/policy became {before}; weights left unchanged")
        g = mean(flat_grad(surrogate, self.policy_params, retain_graph=True))
        local_fvp = fisher_vector_product(kl, self.policy_params, cfg.cg_damping)

        def fvp(vector: torch.Tensor) -> torch.Tensor:
            return mean(local_fvp(vector))

        step_dir = conjugate_gradient(fvp, g, cfg.cg_iters, cfg.cg_residual_tol)
        shs = 0.5 * (step_dir @ fvp(step_dir))
        if not torch.isfinite(shs):
            raise NaNLossError(f"the Fisher quadratic form became {shs.item()}; weights unchanged")
        # Largest step along step_dir whose quadratic KL model reaches max_kl (Appendix C).
        # A zero gradient (e.g. all advantages equal) gives shs = 0: no step to take.
        full_step = step_dir * torch.sqrt(cfg.max_kl / shs) if shs > 0 else step_dir
        expected = g @ full_step
        old_params = flat_concat(self.policy_params).detach()
        accepted, step_kl, improvement = 0.0, 0.0, 0.0
        with torch.no_grad():
            for i in range(cfg.line_search_steps if shs > 0 else 0):
                fraction = 0.5**i
                set_flat_params(self.policy_params, old_params + fraction * full_step)
                new_dist = self.model.distribution(batch.obs, batch.action_mask)
                new_kl = mean(old_dist.kl(new_dist).mean()).item() / dims
                gain = mean(self._surrogate(new_dist, batch, batch.advantages)).item() - before
                # Sampled KL, not the quadratic model, must hold: the model can be far off.
                if new_kl <= cfg.max_kl and gain > 0:
                    accepted, step_kl, improvement = fraction, new_kl, gain
                    break
            else:
                set_flat_params(self.policy_params, old_params)
        return {
            "loss/policy": -before,
            "train/kl": step_kl,
            "train/step_fraction": accepted,
            "train/improvement": improvement,
            "train/expected_improvement": expected.item(),
            "train/entropy": mean(dist.entropy().mean()).item(),
        }

    def update_value(self, batch: RolloutBatch) -> dict[str, float]:
        cfg = self.config
        n = batch.obs.shape[0]
        losses = []
        for _ in range(cfg.vf_epochs):
            permutation = torch.randperm(n).to(self.device)
            for start in range(0, n, cfg.vf_minibatch_size):
                idx = self.part.rows(permutation[start : start + cfg.vf_minibatch_size])
                loss = value_loss(self.model.value(batch.obs[idx]), batch.returns[idx])
                self.part.minimize({"value": loss}, self.vf_optimizer, cfg.vf_max_grad_norm)
                losses.append(self.part.mean(loss.detach()))
        return {"loss/value": torch.stack(losses).mean().item(), "train/vf_lr": cfg.vf_lr}

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "vf_optimizer": self.vf_optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.vf_optimizer.load_state_dict(state["vf_optimizer"])


def _frozen(dist: Any) -> Any:
    """``dist`` owning copies of its tensors, those of the distributions it is made of
    included (factorized and product policies): a Gaussian's ``log_std`` is a view of the
    parameter, which the line search overwrites in place."""
    if isinstance(dist, torch.Tensor):
        return dist.detach().clone()
    if isinstance(dist, (list, tuple)):
        return type(dist)(_frozen(item) for item in dist)
    if not hasattr(dist, "__dict__"):
        return dist
    frozen = copy.copy(dist)
    for name, value in vars(dist).items():
        setattr(frozen, name, _frozen(value))
    return frozen


class TRPOShare:
    """How a TRPO rank of a learner group (`shoal.algos.cores.learner_group`) takes an
    update: the learner's unchanged ``update`` on the whole batch, through its part swapped
    for `RankRows`. Each rank computes the surrogate, its gradient and the Fisher-vector
    products on its rows; every one of them is all-reduced, weighted by the rank's share,
    before conjugate gradient and the line search use it (one all-reduce per Fisher-vector
    product), so every rank takes the step one learner takes; the value regression splits
    each minibatch (`SharedMinimize`)."""

    def __init__(self, learner: TRPOLearner, rank: int, world_size: int):
        self.learner = learner
        learner.part = RankRows(rank, world_size)

    def update(self, args: tuple) -> dict[str, float]:
        return self.learner.update(*args)


class TRPO:
    """One TRPO iteration: sample a rollout, estimate advantages, update, broadcast weights."""

    env_steps = held("env_steps")
    iteration = held("iteration")
    learner = held("learner")
    sampler = held("sampler")

    def __init__(self, config: TRPOConfig):
        self.config = config
        group = functools.partial(LearnerGroup, share_cls=TRPOShare)
        self.core = OnPolicyCore(self.config, TRPOLearner, build_model, "TRPO", group=group)
        self.core.broadcast(set_temperature=True)

    def train_iteration(self) -> dict[str, float]:
        cfg = self.config
        rollout, episodes = self.core.sample()
        batch = make_batch(rollout, cfg.gamma, cfg.gae_lambda)
        return self.core.finish_iteration(self.learner.update(batch), episodes)

    def policy(self) -> ActorPolicy:
        return self.core.policy()

    def state_dict(self) -> dict[str, Any]:
        return self.core.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        return self.core.load_state_dict(state)

    def close(self) -> None:
        self.core.close()


SPECS = (
    AlgorithmSpec(
        "trpo",
        TRPOConfig,
        TRPO,
        build_model,
        "Trust Region Policy Optimization (conjugate-gradient natural step, KL line search, GAE)",
        "Discrete, Box, MultiDiscrete, MultiBinary, Tuple, Dict",
        runners=True,
        learner_groups=True,
    ),
)
"""The names this module registers (`shoal.algos.spec`, `shoal.registry`)."""
