"""Recurrent actor-critic: MLP (or image, `shoal.nn.cnn`) encoder -> LSTM core -> policy and
value heads.

The recurrent state of ``B`` environments is one tensor ``[B, 2, H]`` (LSTM ``h`` and ``c``
stacked), so samplers and checkpoints handle it like any other ``[B, ...]`` array. The sampler
(`shoal.collect.EnvRunner`) carries it across steps and zeroes it at episode starts; learners
replay stored sequences with `RecurrentActorCritic.forward`, which zeroes the state of an
environment wherever ``starts`` marks the first step of an episode.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import torch
from torch import nn

from shoal.config import ModelConfig
from shoal.nn.actor_critic import ActorCritic, ActOutput, encoder_and_body, policy_head
from shoal.nn.distributions import Categorical, DiagGaussian
from shoal.nn.heads import ValueHead


def run_lstm(
    lstm: nn.LSTM, x: torch.Tensor, state: torch.Tensor, starts: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``lstm`` over inputs ``[T, B, D]`` from ``state`` ``[B, 2, H]`` (``h`` and ``c``
    stacked): outputs ``[T, B, H]`` and the state after the last step.

    ``starts[t, b]`` (bool ``[T, B]``) zeroes env ``b``'s state before step ``t``. The sequence
    is cut only at the steps where some env starts an episode; between cuts one fused
    `nn.LSTM` call runs the whole segment."""
    steps, batch = x.shape[:2]
    h, c = state[:, 0].unsqueeze(0).contiguous(), state[:, 1].unsqueeze(0).contiguous()
    cuts = [0, steps]
    if starts is not None:
        cuts = sorted({0, steps, *torch.nonzero(starts.any(1)).flatten().tolist()})
    outputs = []
    for begin, end in zip(cuts[:-1], cuts[1:], strict=True):
        if starts is not None:
            keep = (~starts[begin]).to(h.dtype).view(1, batch, 1)
            h, c = h * keep, c * keep
        out, (h, c) = lstm(x[begin:end], (h, c))
        outputs.append(out)
    features = outputs[0] if len(outputs) == 1 else torch.cat(outputs)
    return features, torch.stack([h[0], c[0]], dim=1)


def init_lstm(lstm: nn.LSTM) -> None:
    """Orthogonal weights; forget-gate bias 1 (Jozefowicz et al. 2015, "An empirical
    exploration of recurrent network architectures"), split over bias_ih and bias_hh:
    remember by default."""
    hidden = lstm.hidden_size
    for name, param in lstm.named_parameters():
        if name.startswith("weight"):
            nn.init.orthogonal_(param)
        else:
            nn.init.zeros_(param)
            param.data[hidden : 2 * hidden] = 0.5


class RecurrentActorCritic(nn.Module):
    """Shared MLP encoder and LSTM, then a policy head and a value head.

    Three ways in: `step` for acting (one step, explicit state), `forward` for training over
    time-major sequences ``[T, B, ...]`` with episode-start resets, and the stateless
    `distribution` used by deployed policies (`shoal.nn.policy.ActorPolicy`), which carries its
    own state from call to call (zero at first, or after `reset_state`).
    """

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, config: ModelConfig):
        super().__init__()
        if config.lstm_hidden is None:
            raise ValueError("RecurrentActorCritic needs ModelConfig.lstm_hidden")
        # An MLP, a user's encoder, or an image encoder (`shoal.nn.cnn`), e.g. Lamb et al.'s
        # Model 3: three convs, then LSTM 256.
        self.encoding, self.body = encoder_and_body(obs_space, config)
        self.hidden_size = config.lstm_hidden
        self.lstm = nn.LSTM(self.body.out_dim, self.hidden_size)
        init_lstm(self.lstm)
        self.policy_head = policy_head(action_space, self.hidden_size, config)
        self.value_head = ValueHead(self.hidden_size)
        self._deployed_state: torch.Tensor | None = None

    def initial_state(self, batch_size: int) -> torch.Tensor:
        """Zero state ``[batch_size, 2, H]``, on the model's device."""
        device = next(self.parameters()).device
        return torch.zeros(batch_size, 2, self.hidden_size, device=device)

    def forward(
        self, obs: torch.Tensor, state: torch.Tensor, starts: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """LSTM features ``[T, B, H]`` of observations ``[T, B, ...]`` from ``state`` ``[B, 2, H]``,
        and the state after the last step.

        ``starts[t, b]`` (bool ``[T, B]``) zeroes env ``b``'s state before step ``t``. The
        sequence is cut only at the steps where some env starts an episode; between cuts one
        fused `nn.LSTM` call runs the whole segment.
        """
        steps, batch = obs.shape[:2]
        x = self.body(self.encoding(obs.flatten(0, 1))).unflatten(0, (steps, batch))
        return run_lstm(self.lstm, x, state, starts)

    def heads(self, features: torch.Tensor) -> tuple[Categorical | DiagGaussian, torch.Tensor]:
        """Action distribution and value of LSTM features ``[N, H]``."""
        return self.policy_head(features), self.value_head(features)

    def step(
        self, obs: torch.Tensor, state: torch.Tensor, deterministic: bool = False
    ) -> tuple[ActOutput, torch.Tensor]:
        """Act on one step of observations ``[B, ...]``; returns the output and the new state."""
        features, state = self(obs.unsqueeze(0), state)
        dist, values = self.heads(features[0])
        actions = dist.mode() if deterministic else dist.sample()
        return ActOutput(actions, dist.log_prob(actions), values), state

    def step_value(self, obs: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """Values ``[B]`` of one step of observations from ``state``."""
        features, _ = self(obs.unsqueeze(0), state)
        return self.value_head(features[0])

    def distribution(self, obs: torch.Tensor) -> Categorical | DiagGaussian:
        """Deployment: the action distribution at ``obs`` ``[B, ...]``, carrying the state
        from the previous call. Nothing tells this call where episodes end, so the state
        is zeroed only at the first call, when ``B`` changes, or by `reset_state` (which
        `ActorPolicy.act` calls for its ``episode_start`` rows): right for the first episode
        of each env, which is what `shoal.collect.evaluate` scores."""
        return self.policy_head(deployed_step(self, obs))

    def reset_state(self, mask: torch.Tensor | None = None) -> None:
        """Zero the deployment state: all envs, or those where ``mask`` ``[B]`` is True."""
        self._deployed_state = zero_rows(self._deployed_state, mask)


def deployed_step(model: Any, obs: torch.Tensor) -> torch.Tensor:
    """A deployed recurrent model's features ``[B, H]`` at ``obs`` ``[B, ...]``, from the state
    its previous call left in ``model._deployed_state`` (zero at the first call or when ``B``
    changes), which it then updates."""
    state = model._deployed_state
    if state is None or state.shape[0] != obs.shape[0]:
        state = model.initial_state(obs.shape[0])
    features, model._deployed_state = model(obs.unsqueeze(0), state)
    return features[0]


def zero_rows(state: torch.Tensor | None, mask: torch.Tensor | None) -> torch.Tensor | None:
    """``state`` ``[B, ...]`` with the rows where ``mask`` ``[B]`` is True zeroed (None: all
    of it, which a deployed model reads as a fresh zero state)."""
    if mask is None or state is None:
        return None
    keep = (~torch.as_tensor(mask, dtype=torch.bool)).to(state.dtype)
    return state * keep.view(-1, *([1] * (state.dim() - 1)))


def is_recurrent(model: object) -> bool:
    """A model the samplers step with an explicit state (`RecurrentActorCritic`, R2D2's
    `shoal.nn.recurrent_q.RecurrentQNetwork`): ``initial_state``, ``step``, ``step_value``."""
    return (
        isinstance(model, RecurrentActorCritic) or getattr(model, "steps_with_state", False) is True
    )


@torch.no_grad()
def chunk_start_states(
    model: RecurrentActorCritic,
    obs: torch.Tensor,
    state: torch.Tensor,
    starts: torch.Tensor,
    chunk: int,
) -> torch.Tensor:
    """States ``[T // chunk, B, 2, H]`` at the start of each ``chunk``-step piece of a rollout
    ``[T, B, ...]`` that started from ``state``, by running ``model`` over it (no gradient:
    truncated backpropagation through time stops at chunk boundaries).

    A state is the one before its chunk's first step; an episode start at that step is
    applied by the forward pass over the chunk, as it is here."""
    states = []
    for begin in range(0, obs.shape[0], chunk):
        states.append(state)
        _, state = model(obs[begin : begin + chunk], state, starts[begin : begin + chunk])
    return torch.stack(states)


def build_actor_critic(
    obs_space: gym.Space, action_space: gym.Space, config: ModelConfig
) -> ActorCritic | RecurrentActorCritic:
    """`RecurrentActorCritic` when ``config.lstm_hidden`` is set, else the MLP `ActorCritic`."""
    if config.lstm_hidden is not None:
        return RecurrentActorCritic(obs_space, action_space, config)
    return ActorCritic(obs_space, action_space, config)
