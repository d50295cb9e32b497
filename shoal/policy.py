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
        self.model = model.cpu().eval()
        self.config = config
        """The training config, when loaded from a run (``shoal.load``)."""
        self.obs_stats: RunningMeanStd | None = None
        if obs_stats is not None:
            self.obs_stats = RunningMeanStd()
            self.obs_stats.load_state_dict(obs_stats)
        self.clip_obs = clip_obs

    @torch.inference_mode()
    def act(
        self,
        obs: np.ndarray,
        deterministic: bool = True,
        episode_start: np.ndarray | None = None,
    ) -> np.ndarray:
        """Actions for a batch of observations ``[B, ...]``.

        ``episode_start`` ``[B]`` (bool): True where ``obs`` is the first observation of a
        new episode. A recurrent policy (LSTM actor-critic, QMIX's GRU agents) starts those
        rows from a zero state; without it, its state runs on from the previous call (zero at
        the first call and when ``B`` changes). Feed-forward policies ignore it."""
        if episode_start is not None and hasattr(self.model, "reset_state"):
            self.model.reset_state(torch.as_tensor(np.asarray(episode_start), dtype=torch.bool))
        if self.obs_stats is not None:
            obs = normalize(obs, self.obs_stats, self.clip_obs)
        dist = self.model.distribution(torch.as_tensor(obs))
        return (dist.mode() if deterministic else dist.sample()).numpy()
