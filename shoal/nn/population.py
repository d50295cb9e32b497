"""Policies of the derivative-free learners, and a whole population of them run as one batch.

The learners search over one flat parameter vector ``[D]``; a population is ``[P, D]``. The
network's forward is its deterministic action (the search perturbs parameters, not actions).
`population_actions` runs ``P`` parameter vectors over their own observations ``[P, E, ...]``
in one vectorized call (`torch.func.vmap` over `torch.func.functional_call`): the Python cost
of a step is that of one network, whatever the population's size, and on a GPU the whole
population's forward is one set of kernels. Networks `vmap` cannot batch (image encoders)
run one forward per individual instead, through the same `functional_call`.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.func import functional_call, vmap

from shoal.config import ModelConfig
from shoal.core.errors import UnsupportedSpaceError
from shoal.nn.actor_critic import encoder_and_body, policy_head
from shoal.nn.actors import ActionChoice
from shoal.nn.distributions import Categorical


def _bounds(action_space: gym.Space) -> tuple[torch.Tensor, torch.Tensor] | None:
    if isinstance(action_space, gym.spaces.Box):
        low = torch.as_tensor(action_space.low, dtype=torch.float32)
        high = torch.as_tensor(action_space.high, dtype=torch.float32)
        return low, high
    return None


class PolicyNetwork(nn.Module):
    """An actor alone (no critic): the encoder and MLP body of ``model`` (an image encoder
    for image observations) and the policy head for the action space. The action is the
    head's mode, clipped to a Box's bounds."""

    low: torch.Tensor | None
    high: torch.Tensor | None

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, model: ModelConfig):
        super().__init__()
        self.encoding, self.body = encoder_and_body(obs_space, model)
        width = model.hidden[-1] if model.hidden and model.encoder == "mlp" else None
        in_dim = width if width is not None else _out_dim(self.encoding, self.body, obs_space)
        self.head = policy_head(action_space, in_dim, model)
        bounds = _bounds(action_space)
        self.register_buffer("low", None if bounds is None else bounds[0])
        self.register_buffer("high", None if bounds is None else bounds[1])
        self.vmappable = model.encoder == "mlp"
        """Image encoders (channels-last convolutions) and users' networks may use operations
        `torch.func.vmap` cannot batch: their population is run one individual at a time."""

    def distribution(self, obs: torch.Tensor) -> ActionChoice:
        action = self.forward(obs)
        return ActionChoice(lambda: action, lambda: action)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """The deterministic actions ``[N, ...]`` for ``obs`` ``[N, ...]``."""
        action = self.head(self.body(self.encoding(obs))).mode()
        if self.low is not None and self.high is not None:
            action = torch.maximum(torch.minimum(action, self.high), self.low)
        return action


def _out_dim(encoding: nn.Module, body: nn.Module, obs_space: gym.Space) -> int:
    """The body's feature width, read off one forward of a sample observation."""
    sample = torch.as_tensor(np.asarray(obs_space.sample())[None])
    with torch.no_grad():
        return int(body(encoding(sample)).shape[-1])


class LinearPolicy(nn.Module):
    """Augmented random search's policy (Mania et al. 2018): ``a = M s`` with ``M`` a
    ``[actions, observations]`` matrix, zero at the start, no bias. A Box action is clipped to
    its bounds; a Discrete action is the largest of ``M s``'s entries."""

    low: torch.Tensor | None
    high: torch.Tensor | None

    def __init__(self, obs_space: gym.Space, action_space: gym.Space):
        super().__init__()
        if not isinstance(obs_space, gym.spaces.Box):
            raise UnsupportedSpaceError(
                f"a linear policy reads a Box observation, not {obs_space}; use a network policy"
            )
        if isinstance(action_space, gym.spaces.Discrete):
            outputs = int(action_space.n)
        elif isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1:
            outputs = int(action_space.shape[0])
        else:
            raise UnsupportedSpaceError(
                f"a linear policy acts in a Discrete or 1-D Box space, not {action_space}"
            )
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        self.weight = nn.Parameter(torch.zeros(outputs, int(np.prod(obs_space.shape))))
        bounds = _bounds(action_space)
        self.register_buffer("low", None if bounds is None else bounds[0])
        self.register_buffer("high", None if bounds is None else bounds[1])

    def distribution(self, obs: torch.Tensor) -> ActionChoice | Categorical:
        if self.discrete:
            return Categorical(obs.float().flatten(1) @ self.weight.T)
        action = self.forward(obs)
        return ActionChoice(lambda: action, lambda: action)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        out = obs.float().flatten(1) @ self.weight.T
        if self.low is None or self.high is None:  # Discrete actions (Box ones have bounds)
            return out.argmax(-1)
        return torch.maximum(torch.minimum(out, self.high), self.low)


def parameter_vector(model: nn.Module) -> torch.Tensor:
    """``[D]``: the model's parameters, flat, in ``named_parameters`` order (a copy)."""
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone()


def set_parameter_vector(model: nn.Module, vector: torch.Tensor) -> None:
    """Write ``vector`` ``[D]`` into the model's parameters."""
    torch.nn.utils.vector_to_parameters(vector.to(next(model.parameters())), model.parameters())


def unflatten(model: nn.Module, vectors: torch.Tensor) -> dict[str, torch.Tensor]:
    """``{name: [P, *shape]}``: each row of ``vectors`` ``[P, D]`` as the model's parameters."""
    params, start = {}, 0
    for name, parameter in model.named_parameters():
        size = parameter.numel()
        params[name] = vectors[:, start : start + size].reshape(-1, *parameter.shape)
        start += size
    if start != vectors.shape[1]:
        raise ValueError(f"the model has {start} parameters, the vectors {vectors.shape[1]}")
    return params


def population_actions(model: nn.Module, vectors: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
    """The deterministic actions ``[P, E, ...]`` of ``P`` policies, policy ``p`` with the
    parameters ``vectors[p]`` acting on ``obs[p]`` (``[P, E, ...]``), in one vectorized call.
    Buffers (action bounds) are shared; equal to a loop over the policies up to float
    rounding (batched matrix products sum in another order)."""
    params = unflatten(model, vectors)

    def act(own: dict[str, torch.Tensor], own_obs: torch.Tensor) -> torch.Tensor:
        return functional_call(model, own, (own_obs,), strict=False)

    with torch.no_grad():
        if getattr(model, "vmappable", True):
            return vmap(act)(params, obs)
        rows = range(len(vectors))  # the seam: one forward per individual, same parameters
        return torch.stack([act({k: v[p] for k, v in params.items()}, obs[p]) for p in rows])
