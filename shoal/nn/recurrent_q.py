"""R2D2's recurrent Q-network (Kapturowski, Ostrovski, Quan, Munos and Dabney 2019,
"Recurrent experience replay in distributed reinforcement learning", ICLR): an MLP (or image)
encoder, an LSTM, and a dueling Q head (`shoal.nn.q_heads.QHead`).

The state of ``B`` environments is one tensor ``[B, 2, H]`` (``h`` and ``c``), as for the
recurrent actor-critic, so the samplers step it the same way (`step`, `step_value`,
`initial_state`; `shoal.collect.EnvRunner` zeroes it at episode starts) and the learner
replays stored sequences with `forward`, which zeroes the state wherever ``starts`` marks an
episode's first step. Exploration is epsilon-greedy with an ``epsilon`` buffer that travels
with the weights (each Ape-X actor sets its own). Deployed, `distribution` carries the state
from call to call like `shoal.nn.recurrent.RecurrentActorCritic`.
"""

from __future__ import annotations

import gymnasium as gym
import torch
from torch import nn

from shoal.config import ModelConfig
from shoal.core.errors import ConfigError, UnsupportedSpaceError
from shoal.core.types import ActOutput
from shoal.nn.actor_critic import encoder_and_body
from shoal.nn.q_heads import QHead
from shoal.nn.recurrent import deployed_step, init_lstm, run_lstm, zero_rows


class EpsilonGreedy:
    """The greedy action (``mode``) or, with probability ``epsilon``, a uniform one
    (``sample``), of Q-values ``[B, A]``."""

    def __init__(self, q: torch.Tensor, epsilon: torch.Tensor):
        self.q, self.epsilon = q, epsilon

    def mode(self) -> torch.Tensor:
        return self.q.argmax(-1)

    def sample(self) -> torch.Tensor:
        random = torch.randint(self.q.shape[-1], self.q.shape[:-1], device=self.q.device)
        explore = torch.rand(self.q.shape[:-1], device=self.q.device) < self.epsilon
        return torch.where(explore, random, self.mode())


class RecurrentQNetwork(nn.Module):
    """See the module docstring."""

    steps_with_state = True
    """Samplers step it with an explicit state (`shoal.nn.recurrent.is_recurrent`)."""
    stores_step_states = True
    """Rollouts keep the state before every step (`shoal.core.types.Rollout.step_states`): R2D2
    stores the actor's state at each sequence start."""

    epsilon: torch.Tensor

    def __init__(
        self, obs_space: gym.Space, action_space: gym.Space, config: ModelConfig, dueling: bool
    ):
        super().__init__()
        if not isinstance(action_space, gym.spaces.Discrete):
            raise UnsupportedSpaceError(f"R2D2 needs Discrete actions, not {action_space}")
        if config.lstm_hidden is None:
            raise ConfigError("R2D2's network needs model.lstm_hidden (the LSTM's width)")
        self.encoding, self.body = encoder_and_body(obs_space, config)
        self.hidden_size = config.lstm_hidden
        self.lstm = nn.LSTM(self.body.out_dim, self.hidden_size)
        init_lstm(self.lstm)
        self.head = QHead(self.hidden_size, int(action_space.n), dueling=dueling)
        self.register_buffer("epsilon", torch.tensor(0.0))
        self._deployed_state: torch.Tensor | None = None

    def initial_state(self, batch_size: int) -> torch.Tensor:
        """Zero state ``[batch_size, 2, H]``, on the model's device."""
        return torch.zeros(batch_size, 2, self.hidden_size, device=self.epsilon.device)

    def forward(
        self, obs: torch.Tensor, state: torch.Tensor, starts: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """LSTM features ``[T, B, H]`` of observations ``[T, B, ...]`` from ``state``, and the
        state after the last step; ``starts`` ``[T, B]`` zeroes the state before a step."""
        steps, batch = obs.shape[:2]
        x = self.body(self.encoding(obs.flatten(0, 1))).unflatten(0, (steps, batch))
        return run_lstm(self.lstm, x, state, starts)

    def q_values(self, features: torch.Tensor) -> torch.Tensor:
        """``[..., A]`` Q-values of LSTM features ``[..., H]``."""
        return self.head(features).squeeze(-1)

    def policy_head(self, features: torch.Tensor) -> EpsilonGreedy:
        return EpsilonGreedy(self.q_values(features), self.epsilon)

    def step(
        self, obs: torch.Tensor, state: torch.Tensor, deterministic: bool = False
    ) -> tuple[ActOutput, torch.Tensor]:
        """Act on one step of observations ``[B, ...]``: epsilon-greedy actions, their
        (unused) log-probabilities as zeros and their Q-values; and the new state."""
        features, state = self(obs.unsqueeze(0), state)
        q = self.q_values(features[0])
        dist = EpsilonGreedy(q, self.epsilon)
        actions = dist.mode() if deterministic else dist.sample()
        taken = q.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
        return ActOutput(actions, torch.zeros_like(taken), taken), state

    def step_value(self, obs: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """``max_a Q`` ``[B]`` of one step of observations from ``state``."""
        features, _ = self(obs.unsqueeze(0), state)
        return self.q_values(features[0]).max(-1).values

    def distribution(self, obs: torch.Tensor) -> EpsilonGreedy:
        """Deployment: the Q-values at ``obs`` ``[B, ...]`` as a policy, carrying the state
        from the previous call (zero at the first call, when ``B`` changes, or after
        `reset_state`)."""
        return self.policy_head(deployed_step(self, obs))

    def reset_state(self, mask: torch.Tensor | None = None) -> None:
        """Zero the deployment state: all envs, or those where ``mask`` ``[B]`` is True."""
        self._deployed_state = zero_rows(self._deployed_state, mask)
