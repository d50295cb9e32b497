"""ACKTR: actor-critic using Kronecker-factored trust region (Wu, Mansimov, Liao, Grosse and Ba
2017, "Scalable trust-region method for deep reinforcement learning using Kronecker-factored
approximation", arXiv:1708.05144).

A2C's rollouts and objective (n-step or GAE advantages, policy gradient + value loss - entropy
bonus), with the gradient step replaced by a natural-gradient step (`shoal.optim.kfac.KFAC`): the
Kronecker factors of every linear and convolution layer come from the model's own
log-likelihood at sampled outputs, the policy's at an action drawn from it and the critic's
as a unit-variance Gaussian around its own value (``vf_fisher_coef`` weighs it), and the step
size is clipped so that the step's Fisher norm stays under ``kfac.kl_clip``. Defaults follow
OpenAI Baselines' ACKTR (lr 0.25, momentum 0.9, damping 0.01, KL clip 0.001, 20 steps).
Recurrent models are refused: K-FAC has no factors for an LSTM.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass, field
from typing import Any, ClassVar

import gymnasium as gym
import torch

from shoal.algos.cores.checks import check_no_masks
from shoal.algos.cores.group_shares import RankRows, WholeBatch
from shoal.algos.cores.learner_group import LearnerGroup
from shoal.algos.cores.metrics import mean_metrics, step_metrics
from shoal.algos.cores.on_policy import ModelLearner, OnPolicyCore, held
from shoal.algos.cores.rollout_batch import RolloutBatch, make_batch
from shoal.algos.spec import AlgorithmSpec
from shoal.config import EnvConfig, ModelConfig, OptimConfig, RunConfig, check, check_positive
from shoal.config.usage import OWN_GAMMA
from shoal.core.device import to_device
from shoal.distributed.collective import agree_finite, average_gradients
from shoal.fast.backend import TorchStep, evaluate_objective
from shoal.losses.objectives import a2c_objective, standardize
from shoal.nn import ActorCritic, RecurrentActorCritic, build_actor_critic
from shoal.nn.distributions import Distribution
from shoal.nn.policy import ActorPolicy
from shoal.optim.kfac import KFAC
from shoal.optim.schedules import scheduled


@dataclass(frozen=True)
class KFACConfig:
    """The natural-gradient step (`shoal.optim.kfac.KFAC`); the step size is ``optim.lr``."""

    momentum: float = 0.9
    """Momentum of the step."""
    stat_decay: float = 0.99
    """Running-average decay of the Kronecker factors."""
    damping: float = 0.01
    """Tikhonov damping added to the factored Fisher's eigenvalues."""
    kl_clip: float = 0.001
    """Trust region: the largest Fisher norm (twice the second-order KL) of one step."""
    inverse_every: int = 1
    """Recompute the factors' eigendecompositions every this many updates."""
    vf_fisher_coef: float = 1.0
    """Weight of the critic's Gaussian log-likelihood in the Fisher statistics."""

    def __post_init__(self) -> None:
        check(self, "momentum", 0.0 <= self.momentum < 1.0, "must be in [0, 1)")
        check(self, "stat_decay", 0.0 <= self.stat_decay < 1.0, "must be in [0, 1)")
        check(self, "damping", self.damping > 0, "must be > 0")
        check(self, "kl_clip", self.kl_clip > 0, "must be > 0")
        check_positive(self, "inverse_every")
        check(self, "vf_fisher_coef", self.vf_fisher_coef >= 0, "must be >= 0")


@dataclass(frozen=True)
class ACKTRConfig:
    """ACKTR hyperparameters (OpenAI Baselines' defaults)."""

    run: RunConfig = field(default_factory=RunConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=0.25, max_grad_norm=None))
    model: ModelConfig = field(default_factory=ModelConfig)
    kfac: KFACConfig = field(default_factory=KFACConfig)
    num_steps: int = 20
    """Steps per environment in each rollout."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 1.0
    """GAE lambda; 1.0 gives n-step returns bootstrapped from V(s_{t+n})."""
    vf_coef: float = 0.5
    """Weight of the value loss."""
    ent_coef: float = 0.01
    """Weight of the entropy bonus."""
    normalize_advantages: bool = False
    """Standardize the advantages within each rollout."""

    UNUSED: ClassVar[dict[str, str]] = {
        **OWN_GAMMA,
        "optim.eps": "K-FAC damps its steps with kfac.damping, not Adam's epsilon",
    }

    def __post_init__(self) -> None:
        check_positive(self, "num_steps")
        check(self, "gamma", 0.0 <= self.gamma <= 1.0, "must be in [0, 1]")
        check(self, "gae_lambda", 0.0 <= self.gae_lambda <= 1.0, "must be in [0, 1]")
        check(self, "vf_coef", self.vf_coef >= 0, "must be >= 0")
        check(self, "ent_coef", self.ent_coef >= 0, "must be >= 0")
        check(
            self.model,
            "lstm_hidden",
            self.model.lstm_hidden is None,
            "ACKTR's K-FAC has no Kronecker factors for recurrent layers; unset it",
        )
        check(
            self.model,
            "backend",
            self.model.backend != "numpy",
            "ACKTR reads layer activations through autograd hooks: use auto or torch",
        )
        check(
            self.run,
            "compile",
            not self.run.compile,
            "ACKTR reads layer activations through hooks, which a compiled model skips",
        )
        check_no_masks(self, "ACKTR")


def build_model(
    config: ACKTRConfig, obs_space: gym.Space, action_space: gym.Space
) -> ActorCritic | RecurrentActorCritic:
    return build_actor_critic(obs_space, action_space, config.model)  # K-FAC refuses LSTMs


def fisher_draws(dist: Distribution, values: torch.Tensor) -> tuple[Any, torch.Tensor]:
    """The outputs the Fisher statistics are taken at: an action sampled from the policy and
    a unit-variance Gaussian draw around the critic's (detached) value, per row; constants
    (a Gaussian's sample is ``mean + std * eps``: left on the graph, its log-likelihood's
    gradient through the mean would vanish, and with it the mean head's Fisher factor)."""
    with torch.no_grad():
        return dist.sample(), values.detach() + torch.randn_like(values)


def fisher_loss(
    dist: Distribution, values: torch.Tensor, vf_coef: float, draws: tuple | None = None
) -> torch.Tensor:
    """The batch mean of the model's log-likelihood of outputs drawn from itself (``draws``,
    else drawn here, `fisher_draws`): the policy's at the sampled action, the critic's as a
    unit-variance Gaussian. Its gradients give the true Fisher's Kronecker factors
    (`shoal.optim.kfac`)."""
    actions, noisy_values = fisher_draws(dist, values) if draws is None else draws
    value_log_likelihood = -0.5 * (values - noisy_values).pow(2)
    return dist.log_prob(actions).mean() + vf_coef * value_log_likelihood.mean()


class ACKTRLearner(ModelLearner[ActorCritic | RecurrentActorCritic]):
    """The actor-critic and its K-FAC optimizer; one natural-gradient step per rollout."""

    def __init__(self, config: ACKTRConfig, obs_space: gym.Space, action_space: gym.Space):
        self.config = config
        kf = config.kfac
        model = build_model(config, obs_space, action_space)

        def make_optimizer(_: list[torch.Tensor]) -> KFAC:
            return KFAC(
                self.model, config.optim.lr, kf.momentum, kf.stat_decay, kf.damping,
                kf.kl_clip, config.optim.weight_decay, kf.inverse_every,
            )  # fmt: skip

        self.setup(config, model, make_optimizer)
        assert isinstance(self.optimizer, KFAC)
        self.kfac = self.optimizer
        self.step = TorchStep(self.model, self.scaler)
        self.objective = a2c_objective(config.vf_coef, config.ent_coef, config.normalize_advantages)
        self.part: WholeBatch | RankRows = WholeBatch()
        """How it takes a batch, a part: all of it, or a learner group's rank's rows, the
        Kronecker factors and gradients all-reduced (`ACKTRShare`)."""

    def losses(self, batch: RolloutBatch) -> dict[str, torch.Tensor]:
        """The objective's loss terms on a batch through autograd, ``total`` last (no step)."""
        return evaluate_objective(self.model, self.objective, to_device(batch, self.device))[0]

    def update(self, batch: RolloutBatch, lr: float) -> dict[str, float]:
        self.optimizer.param_groups[0]["lr"] = lr
        whole = to_device(batch, self.device)
        batch = self.part.rows(whole)
        with self.kfac.record():
            dist, values = self.model(batch.obs)
        draws = None  # one learner draws them from its outputs
        if batch is not whole:  # a rank: the whole batch's draws (one learner's), its rows'
            with torch.no_grad():
                draws = self.part.rows(fisher_draws(*self.model(whole.obs)))
        self.kfac.accumulate(fisher_loss(dist, values, self.config.kfac.vf_fisher_coef, draws))
        max_norm = self.config.optim.max_grad_norm
        losses, stats = self.step(self.objective, batch, self.optimizer, max_norm, (dist, values))
        metrics = mean_metrics([step_metrics(losses, stats)])
        metrics["train/lr"] = lr
        metrics["train/trust_region_scale"] = self.kfac.last_scale
        return metrics


class ACKTRShare:
    """How an ACKTR rank of a learner group (`shoal.algos.cores.learner_group`) takes an
    update: its contiguous rows of the rollout (advantages standardized over the whole of it
    first, where asked), at the Fisher draws one learner takes on the whole (drawn from a
    forward pass over it, without gradient); the Kronecker factors of its rows and its
    gradients are summed over the ranks weighted by their shares (one all-reduce per factor,
    one for the gradients), so every rank takes one learner's natural-gradient step.
    Returns ``(share, metrics)``."""

    def __init__(self, learner: ACKTRLearner, rank: int, world_size: int):
        self.learner = learner
        part = learner.part = RankRows(rank, world_size)
        learner.kfac.reduce = part.mean
        who = f"learner {rank} of the group"
        learner.step = TorchStep(
            learner.model,
            learner.scaler,
            before_minimize=lambda losses: agree_finite(losses, who),
            before_clip=lambda: average_gradients(learner.parameters, part.weight),
        )
        self.normalize = learner.objective.normalize_advantages
        learner.objective = copy.copy(learner.objective)
        learner.objective.normalize_advantages = False  # done over the whole rollout here

    def update(self, args: tuple[RolloutBatch, float]) -> tuple[float, dict[str, float]]:
        batch, lr = args
        if self.normalize:
            batch = batch._replace(advantages=standardize(batch.advantages))
        metrics = self.learner.update(batch, lr)
        return self.learner.part.weight, metrics


class ACKTR:
    """One ACKTR iteration: sample a rollout, estimate advantages, one K-FAC step, broadcast."""

    env_steps = held("env_steps")
    iteration = held("iteration")
    learner = held("learner")
    sampler = held("sampler")

    def __init__(self, config: ACKTRConfig):
        self.config = config
        self.core = OnPolicyCore(
            self.config,
            ACKTRLearner,
            build_model,
            "ACKTR",
            takes_action_masks=False,
            group=functools.partial(LearnerGroup, share_cls=ACKTRShare),
        )
        self.core.broadcast(set_temperature=True)

    def train_iteration(self) -> dict[str, float]:
        cfg = self.config
        lr = scheduled(cfg.optim.lr_schedule, cfg.optim.lr, self.core.progress())
        rollout, episodes = self.core.sample()
        batch = make_batch(rollout, cfg.gamma, cfg.gae_lambda)
        return self.core.finish_iteration(self.learner.update(batch, lr), episodes)

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
        "acktr",
        ACKTRConfig,
        ACKTR,
        build_model,
        "ACKTR: A2C with K-FAC natural-gradient steps in a KL trust region",
        "Discrete, Box, MultiDiscrete, MultiBinary, Tuple, Dict",
        runners=True,
        learner_groups=True,
    ),
)
"""The names this module registers (`shoal.algos.spec`, `shoal.registry`)."""
