"""A user's own networks, named by import path: an observation encoder (``model.encoder
mypkg.nets:MyEncoder``) and, for the actor-critics, a policy head (``model.policy_head
mypkg.nets:MyHead``, `custom_head`).

The encoder class is called as ``MyEncoder(observation_space, model_config)`` and must return an
``nn.Module`` with an integer attribute ``out_dim``; its forward pass maps a batch of
observations ``[N, ...]`` (as stored: float32 vectors, uint8 images, int64 discrete values) to
features ``[N, out_dim]``. For a Dict or Tuple observation space it receives the packed space
(`shoal.envs.composite.PackedObs`, whose ``original`` is the env's space) and records
``[N, record_bytes]``; ``space.unpack_tensor(obs)`` gives the parts as a dict/tuple of
tensors.

Where the features go, by family:

* actor-critics (PPO, A2C, PG, TRPO, IMPALA, A3C, DD-PPO) and Q-networks (the DQN family):
  the encoder replaces the MLP trunk, and the heads read its features (as an image encoder's);
  separate actor and critic trunks (``model.shared_trunk false``) are two instances; a
  recurrent model (``model.lstm_hidden``) feeds them to its LSTM;
* off-policy actor-critics (DDPG, TD3, SAC, D4PG): the actor and the critics each own an
  instance, followed by the ``model.hidden`` MLP (the critics' with the action joined to the
  features).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from shoal.core.errors import ConfigError
from shoal.core.imports import build_named, subclass_of


def custom_head(in_dim: int, action_space: gym.Space, config: Any) -> nn.Module:
    """An instance of the policy head class ``config.policy_head`` names: built as
    ``Class(in_dim, action_space, model_config)``, its forward pass maps features ``[N,
    in_dim]`` to a distribution with ``sample()``, ``mode()``, ``log_prob(actions)`` and
    ``entropy()`` (and ``kl(other)`` for TRPO), like `shoal.nn.distributions`'; a head that
    takes legal-action masks has ``forward(features, mask)``."""
    return _build(config.policy_head, "model.policy_head", in_dim, action_space, config)


def is_custom(encoder: str) -> bool:
    """Whether ``ModelConfig.encoder`` names a user's class (``module:Class``)."""
    return ":" in encoder


def custom_encoder(obs_space: gym.Space, config: Any) -> nn.Module:
    """An instance of the encoder class ``config.encoder`` names, checked."""
    path = config.encoder
    encoder = _build(path, "model.encoder", obs_space, config)
    out_dim = getattr(encoder, "out_dim", None)
    if not isinstance(out_dim, int) or out_dim <= 0:
        raise ConfigError(
            f"model.encoder {path!r} must set out_dim, the number of features its forward "
            f"pass returns per observation (a positive int); got {out_dim!r}"
        )
    check_forward(encoder, obs_space, path, out_dim)
    return encoder


def check_forward(encoder: nn.Module, obs_space: gym.Space, path: str, out_dim: int) -> None:
    """Run the encoder once on two observations of ``obs_space`` as storage holds them
    (float32 vectors, uint8 images and packed records, int64 discrete values), so that an
    encoder that cannot read them fails here, naming what it got, not mid-training."""
    sample = np.stack([obs_space.sample() for _ in range(2)])
    if np.issubdtype(sample.dtype, np.floating):
        sample = sample.astype(np.float32)
    elif np.issubdtype(sample.dtype, np.signedinteger):
        sample = sample.astype(np.int64)
    batch = torch.as_tensor(sample)
    training = encoder.training
    encoder.eval()
    try:
        with torch.no_grad():
            features = encoder(batch)
    except Exception as exc:
        packed = hasattr(obs_space, "unpack_tensor")
        hint = " (a Dict or Tuple space comes packed: obs_space.unpack_tensor(obs) gives its parts)"
        raise ConfigError(
            f"model.encoder {path!r} fails on a batch of observations of {obs_space} as "
            f"stored ({batch.dtype} {list(batch.shape)}): {type(exc).__name__}: {exc}"
            + (hint if packed else "")
        ) from exc
    finally:
        encoder.train(training)
    shape = tuple(getattr(features, "shape", ()))
    if shape != (2, out_dim):
        raise ConfigError(
            f"model.encoder {path!r} returned features of shape {list(shape)} for 2 "
            f"observations; it must return [N, out_dim] = [2, {out_dim}]"
        )


def _build(path: str, field: str, *args: Any) -> nn.Module:
    """``Class(*args)`` for the class ``path`` names in ``field``, checked to be a module."""
    built = build_named(path, field, "class", {}, *args,
                        check=subclass_of(nn.Module, "an nn.Module subclass"))  # fmt: skip
    if not isinstance(built, nn.Module):
        raise ConfigError(f"{field} {path!r} built a {type(built).__name__}, not an nn.Module")
    return built
