"""A2C: synchronous advantage actor-critic (Mnih et al. 2016, arXiv:1602.01783; the synchronous
variant of OpenAI Baselines, Wu et al. 2017).

Short rollouts over vector envs, n-step or GAE advantages bootstrapped from the critic (at the
rollout's end and at time-limit truncations, from the true final observation), one gradient step
per rollout on policy gradient + value loss - entropy bonus, with RMSProp as in the paper or
Adam. The rollout batch and its advantages are PPO's (`shoal.algos.policy_gradient.ppo.make_batch`).

With an LSTM core (``model.lstm_hidden``) the update replays the rollout ``[T, B]`` in time
order from the state the sampler started it with (`Rollout.policy_state`), zeroing the state
at episode starts inside the rollout and detaching it every ``bptt_chunk`` steps (truncated
backpropagation through time); autoreset steps stay in the sequence but out of the loss.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import gymnasium as gym
import torch

from shoal.algos.cores.checks import check_bptt_chunk, check_learner_group, check_masks
from shoal.algos.cores.metrics import mean_metrics, step_metrics
from shoal.algos.cores.on_policy import ModelLearner, OnPolicyCore, held
from shoal.algos.cores.rollout_batch import (
    RolloutBatch,
    RolloutSequenceBatch,
    make_batch,
    make_sequence_batch,
)
from shoal.algos.spec import NUMPY_BACKENDS, AlgorithmSpec
from shoal.config import (
    EnvConfig,
    ModelConfig,
    OptimConfig,
    RunConfig,
    check,
    check_choices,
    check_positive,
    is_nested,
)
from shoal.config.usage import OWN_GAMMA
from shoal.core.device import to_device
from shoal.fast.backend import evaluate_objective, learner_step
from shoal.losses.objectives import a2c_objective
from shoal.nn import ActorCritic, RecurrentActorCritic, build_actor_critic
from shoal.nn.policy import ActorPolicy
from shoal.optim import rmsprop_or_adamw
from shoal.optim.schedules import scheduled


@dataclass(frozen=True)
class A2CConfig:
    """A2C hyperparameters. The defaults are Stable-Baselines3's (5 steps, RMSProp 7e-4,
    entropy 0.0, gradient norm 0.5), which follow the A3C paper."""

    run: RunConfig = field(default_factory=RunConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=7e-4))
    model: ModelConfig = field(default_factory=ModelConfig)
    num_steps: int = 5
    """Steps per environment in each rollout: the n of the n-step returns."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 1.0
    """GAE lambda; 1.0 gives the paper's n-step returns bootstrapped from V(s_{t+n})."""
    vf_coef: float = 0.5
    """Weight of the value loss."""
    ent_coef: float = 0.0
    """Weight of the entropy bonus."""
    normalize_advantages: bool = False
    """Standardize the advantages within each rollout."""
    optimizer: Literal["rmsprop", "rmsprop-tf", "adam"] = "rmsprop"
    """rmsprop: PyTorch's RMSProp, SB3's default (smoothing rms_alpha, epsilon optim.eps,
    weight decay as an L2 term); rmsprop-tf: the same rule as Mnih et al. 2016 write it and
    TensorFlow runs it (average starting at 1, epsilon inside the square root; SB3's
    RMSpropTFLike, what the Atari settings of rl-baselines3-zoo use; `shoal.optim`);
    adam: AdamW (decoupled weight decay)."""
    rms_alpha: float = 0.99
    """Smoothing constant of RMSProp's squared-gradient average."""
    bptt_chunk: int | None = None
    """Recurrent models (model.lstm_hidden): truncated backpropagation through time over
    pieces of this many steps per env (None: the whole rollout, num_steps). It must divide
    num_steps."""

    UNUSED: ClassVar[dict[str, str]] = OWN_GAMMA

    def __post_init__(self) -> None:
        check_positive(self, "num_steps")
        check_choices(self)
        check(self, "gamma", 0.0 <= self.gamma <= 1.0, "must be in [0, 1]")
        check(self, "gae_lambda", 0.0 <= self.gae_lambda <= 1.0, "must be in [0, 1]")
        check(self, "vf_coef", self.vf_coef >= 0, "must be >= 0")
        check(self, "ent_coef", self.ent_coef >= 0, "must be >= 0")
        check(self, "rms_alpha", 0.0 < self.rms_alpha < 1.0, "must be in (0, 1)")
        if not is_nested(self):
            check_masks(self, "A2C")
            rollout = self.num_steps * self.env.num_envs * max(1, self.run.runners)
            check_learner_group(self, "A2C", rollout)
        check_bptt_chunk(self)

    @property
    def chunk(self) -> int:
        """Steps per truncated-BPTT piece of a recurrent model."""
        return self.bptt_chunk or self.num_steps


def build_model(
    config: A2CConfig, obs_space: gym.Space, action_space: gym.Space
) -> ActorCritic | RecurrentActorCritic:
    return build_actor_critic(obs_space, action_space, config.model)


def make_optimizer(config: A2CConfig, parameters: list[torch.Tensor]) -> torch.optim.Optimizer:
    return rmsprop_or_adamw(config.optimizer, parameters, config.optim, config.rms_alpha)


class A2CLearner(ModelLearner[ActorCritic | RecurrentActorCritic]):
    """Owns the actor-critic and its optimizer; one gradient step per rollout on the A2C
    objective (`shoal.losses.objectives.a2c_objective`), through autograd or the NumPy path
    (`shoal.fast.backend.learner_step`)."""

    def __init__(self, config: A2CConfig, obs_space: gym.Space, action_space: gym.Space):
        self.config = config
        model = build_model(config, obs_space, action_space)
        self.setup(config, model, functools.partial(make_optimizer, config))
        self.step = learner_step(
            self.model, config.model.backend, self.device, config.run.compile, self.scaler
        )
        self.objective = a2c_objective(config.vf_coef, config.ent_coef, config.normalize_advantages)

    def losses(self, batch: RolloutBatch | RolloutSequenceBatch) -> dict[str, torch.Tensor]:
        """The objective's loss terms on a batch through autograd, ``total`` last (no step)."""
        batch, outputs = self._flat(to_device(batch, self.device))
        return evaluate_objective(self.model, self.objective, batch, outputs)[0]

    def _flat(
        self, batch: RolloutBatch | RolloutSequenceBatch
    ) -> tuple[RolloutBatch, tuple | None]:
        """A feed-forward batch as it is; a recurrent one replayed (`_replay`)."""
        if isinstance(batch, RolloutSequenceBatch):
            outputs, batch = self._replay(batch)
            return batch, outputs
        return batch, None

    def _replay(self, batch: RolloutSequenceBatch) -> tuple[tuple, RolloutBatch]:
        """Recurrent models: the ``(distribution, values)`` of the valid steps of a time-major
        rollout batch ``[T, B]``, run in time order from its initial state; the state is
        detached every ``config.chunk`` steps, so the gradient stops there (truncated BPTT).
        Also returns the valid samples, flat, in the same order."""
        chunk, steps = self.config.chunk, batch.chunks.obs.shape[0]
        model = self.model
        assert isinstance(model, RecurrentActorCritic)  # sequence batches are recurrent ones
        state = batch.initial_state
        pieces = []
        for begin in range(0, steps, chunk):
            features, state = model(
                batch.chunks.obs[begin : begin + chunk], state, batch.starts[begin : begin + chunk]
            )
            pieces.append(features)
            state = state.detach()
        keep = batch.valid.flatten()
        features = pieces[0] if len(pieces) == 1 else torch.cat(pieces)
        outputs = model.heads(features.flatten(0, 1)[keep])
        return outputs, batch.chunks.map(lambda x: x.flatten(0, 1)[keep])

    def update(self, batch: RolloutBatch | RolloutSequenceBatch, lr: float) -> dict[str, float]:
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        batch, outputs = self._flat(to_device(batch, self.device))
        max_norm = self.config.optim.max_grad_norm
        losses, stats = self.step(self.objective, batch, self.optimizer, max_norm, outputs)
        metrics = mean_metrics([step_metrics(losses, stats)])
        metrics["train/lr"] = lr
        return metrics


class A2C:
    """One A2C iteration: sample a rollout, estimate advantages, one update, broadcast."""

    env_steps = held("env_steps")
    iteration = held("iteration")
    learner = held("learner")
    sampler = held("sampler")

    def __init__(self, config: A2CConfig):
        self.config = config
        self.core = OnPolicyCore(self.config, A2CLearner, build_model, "A2C")
        self.core.broadcast(set_temperature=True)

    def train_iteration(self) -> dict[str, float]:
        cfg = self.config
        lr = scheduled(cfg.optim.lr_schedule, cfg.optim.lr, self.core.progress())
        rollout, episodes = self.core.sample()
        # Autoreset transitions are dropped by make_batch; truncations bootstrap from the
        # final observation's value (`Rollout.next_values`). Recurrent models keep the
        # rollout time-major ([T, B]: one piece of num_steps per env), masked the same way.
        batch: RolloutBatch | RolloutSequenceBatch
        if cfg.model.lstm_hidden is None:
            batch = make_batch(rollout, cfg.gamma, cfg.gae_lambda)
        else:
            batch = make_sequence_batch(rollout, cfg.gamma, cfg.gae_lambda, cfg.num_steps)
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
        "a2c",
        A2CConfig,
        A2C,
        build_model,
        "A2C: synchronous advantage actor-critic (n-step/GAE, RMSProp or Adam)",
        "Discrete, Box, MultiDiscrete, MultiBinary, Tuple, Dict",
        backends=NUMPY_BACKENDS,
        runners=True,
        learner_groups=True,
    ),
)
"""The names this module registers (`shoal.algos.spec`, `shoal.registry`)."""
