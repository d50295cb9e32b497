"""Deployable policies: numpy observations in, numpy actions out."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from shoal.envs.normalize import RunningMeanStd, normalize


class ActorPolicy:
    """A trained actor plus the observation statistics it was trained with (frozen).

    ``model`` must provide ``distribution(obs)`` returning an action distribution with
    ``mode()`` and ``sample()`` (every shoal policy network does). Used by evaluation,
    ``shoal eval`` and ``shoal.load``.
    """

    def __init__(
        self,
        model: nn.Module,
        obs_stats: dict[str, Any] | None = None,
        clip_obs: float = 10.0,
        config: Any = None,
    ):
        self.model = model.eval()
        self.config = config
        """The training config, when loaded from a run (``shoal.load``)."""
        self.obs_stats: RunningMeanStd | None = None
        if obs_stats is not None:
            self.obs_stats = RunningMeanStd()
            self.obs_stats.load_state_dict(obs_stats)
        self.clip_obs = clip_obs

    @torch.inference_mode()
    def act(self, obs: np.ndarray, deterministic: bool = True) -> np.ndarray:
        """Actions for a batch of observations ``[B, ...]``."""
        if self.obs_stats is not None:
            obs = normalize(obs, self.obs_stats, self.clip_obs)
        dist = self.model.distribution(torch.as_tensor(obs))
        return (dist.mode() if deterministic else dist.sample()).numpy()
