"""CTEDD's stage 2 (Chen 2019, "A New Framework for Multi-Agent Reinforcement Learning",
section 4.2): chronological policy distillation of decentralized local policies from the
centralized global ones, on states from the replay only (no new env samples).

A `Student` is one set of local policies (one message size) and its optimizer. A round
(`distill_round`) passes once over the replay's valid rows from the oldest to the newest
(`chronological_rows`), in consecutive minibatches, each trained for ``repeats`` steps of
Eq. (6) toward the global policies' deterministic actions, so the last updates fit the state
distribution of the latest global policy.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from shoal.data.replay import ReplayBuffer
from shoal.losses.distillation import distillation_loss
from shoal.nn.local_policies import LocalPolicies
from shoal.optim import build_optimizer, minimize


class Student:
    """One set of local policies (one message size) and its optimizer."""

    def __init__(self, policies: LocalPolicies, lr: float):
        self.policies = policies
        self.optimizer = build_optimizer(policies.parameters(), "adam", lr, eps=1e-8)

    def fit(self, obs: torch.Tensor, teacher: torch.Tensor, repeats: int) -> float:
        """``repeats`` gradient steps of Eq. (6) on one minibatch ``[K, N, o]``, ``[K, N, d]``."""
        for _ in range(repeats):
            loss = distillation_loss(teacher, self.policies(obs))
            minimize({"distillation": loss}, self.optimizer)
        return loss.item()

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.policies.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.policies.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])


def chronological_rows(replay: ReplayBuffer, written: int) -> np.ndarray:
    """The valid rows ``[K, row_dim]`` of a replay that has had ``written`` vector steps
    stored, oldest first (vector steps in the order they were stored, envs in order within a
    step)."""
    rows = replay.rows
    order = np.arange(written) if written <= rows else (written + np.arange(rows)) % rows
    order = order[replay.valid[order].any(axis=1)]
    data, valid = replay.obs[order], replay.valid[order]
    return data[valid]


def distill_round(
    students: dict[int, Student],
    obs: torch.Tensor,
    teacher: torch.Tensor,
    batch_size: int,
    repeats: int,
) -> dict[str, float]:
    """One chronological round of every student on observations ``[K, N, o]`` and the
    teacher's actions ``[K, N, d]``; returns each student's mean last-step loss
    (``distill/loss_m<message size>``)."""
    metrics: dict[str, float] = {}
    for m, student in students.items():
        losses = [
            student.fit(obs[i : i + batch_size], teacher[i : i + batch_size], repeats)
            for i in range(0, len(obs), batch_size)
        ]
        metrics[f"distill/loss_m{m}"] = float(np.mean(losses)) if losses else 0.0
    return metrics
