"""Cutting the rollouts of recurrent actors into R2D2's replay sequences (Kapturowski et al.
2019, "Recurrent experience replay in distributed reinforcement learning", section 3).

Each env's running episode is buffered step by step: the observation, the action, reward and
termination of the transition from it, and the actor's recurrent state *before* it (the state
the actor had when it saw the observation, `shoal.core.types.Rollout.step_states`). A sequence has
``burn_in + length`` transitions and the ``burn_in + length + 1`` observations they connect;
sequences start every ``period`` steps of the episode (``period < length``: they overlap),
the first one ``burn_in`` steps before the episode's first step, so that no step of an episode
goes unlearned: those positions are padding, marked invalid, and ``starts`` marks where the
episode begins (the learner's LSTM zeroes its state there). A sequence never runs past its
episode's end: after the last transition it holds the final observation (which a time-limit
truncation bootstraps from), then padding. Each sequence keeps the actor's state at its first
step (zero when it begins on padding): R2D2's "stored state", refreshed by the burn-in.

Rollouts come with next-step autoreset (`shoal.core.types.StepResult`): the step after an
episode's last transition is not a transition (``valid`` False; its observation is the final
one), and the next valid step is the new episode's first.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from shoal.core.types import Rollout

Sequence = dict[str, np.ndarray]


class _Episode:
    """One env's running episode: its steps from episode index ``offset`` on."""

    def __init__(self, burn_in: int):
        self.obs: list[np.ndarray] = []
        self.actions: list[Any] = []
        self.rewards: list[float] = []
        self.terminated: list[bool] = []
        self.states: list[np.ndarray] = []
        self.offset = 0
        self.next_start = -burn_in

    def __len__(self) -> int:
        """Episode steps seen so far (transitions; their observations are stored)."""
        return self.offset + len(self.obs)

    def state_dict(self) -> dict[str, Any]:
        """Plain arrays and ints (checkpoints load without unpickling objects)."""
        state: dict[str, Any] = {"offset": self.offset, "next_start": self.next_start}
        for name in FIELDS:
            items = getattr(self, name)
            state[name] = np.stack([np.asarray(x) for x in items]) if items else None
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.offset, self.next_start = int(state["offset"]), int(state["next_start"])
        for name in FIELDS:
            setattr(self, name, [] if state[name] is None else list(state[name]))


FIELDS = ("obs", "actions", "rewards", "terminated", "states")


class SequenceBuilder:
    """Turns rollouts ``[T, B]`` into sequences; see the module docstring."""

    def __init__(self, num_envs: int, burn_in: int, length: int, period: int):
        if burn_in < 0 or length < 1 or not 1 <= period <= length:
            raise ValueError(
                f"need burn_in >= 0, length >= 1 and 1 <= period <= length; got burn_in = "
                f"{burn_in}, length = {length}, period = {period}"
            )
        self.burn_in, self.length, self.period = burn_in, length, period
        self.episodes = [_Episode(burn_in) for _ in range(num_envs)]

    @property
    def steps(self) -> int:
        """Transitions per sequence: ``burn_in + length``."""
        return self.burn_in + self.length

    def add(self, rollout: Rollout) -> list[Sequence]:
        """The sequences this rollout completes (the rollout must carry ``step_states`` and
        ``last_obs``)."""
        if rollout.step_states is None or rollout.last_obs is None:
            raise ValueError("sequences need rollouts with step_states and last_obs")
        obs, actions = rollout.obs.numpy(), rollout.actions.numpy()
        rewards, states = rollout.rewards.numpy(), rollout.step_states.numpy()
        terminated, truncated = rollout.terminated.numpy(), rollout.truncated.numpy()
        valid, last_obs = rollout.valid.numpy(), rollout.last_obs.numpy()
        steps = len(obs)
        out: list[Sequence] = []
        for b, episode in enumerate(self.episodes):
            for t in np.flatnonzero(valid[:, b]):
                # Copies: a sampler reuses its rollout buffers for the next rollout.
                episode.obs.append(obs[t, b].copy())
                episode.actions.append(actions[t, b].copy())
                episode.rewards.append(float(rewards[t, b]))
                episode.terminated.append(bool(terminated[t, b]))
                episode.states.append(states[t, b].copy())
                if terminated[t, b] or truncated[t, b]:
                    final = (obs[t + 1, b] if t + 1 < steps else last_obs[b]).copy()
                    out += self._finish(episode, final)
                    self.episodes[b] = episode = _Episode(self.burn_in)
                else:
                    out += self._ready(episode)
        return out

    def _ready(self, episode: _Episode) -> list[Sequence]:
        """The running episode's sequences whose steps and bootstrap observation are all
        stored."""
        out = []
        while episode.next_start + self.steps + 1 <= len(episode):
            out.append(self._cut(episode, episode.next_start, final=None, end=len(episode)))
            self._advance(episode)
        return out

    def _finish(self, episode: _Episode, final: np.ndarray) -> list[Sequence]:
        """Every remaining sequence of an ended episode with a step to learn."""
        out = []
        end = len(episode)
        while episode.next_start + self.burn_in < end:
            out.append(self._cut(episode, episode.next_start, final, end))
            self._advance(episode)
        return out

    def _advance(self, episode: _Episode) -> None:
        episode.next_start += self.period
        drop = max(0, episode.next_start) - episode.offset
        if drop > 0:
            for name in FIELDS:
                del getattr(episode, name)[:drop]
            episode.offset += drop

    def _cut(self, episode: _Episode, start: int, final: np.ndarray | None, end: int) -> Sequence:
        """The sequence of episode steps ``start .. start + steps - 1`` (``end``: the steps
        known; ``final``: the final observation of an ended episode)."""
        n, offset = self.steps, episode.offset
        first = episode.obs[0]
        obs = np.zeros((n + 1, *first.shape), dtype=first.dtype)
        actions = np.zeros(
            (n, *np.shape(episode.actions[0])), dtype=np.asarray(episode.actions[0]).dtype
        )
        rewards = np.zeros(n, dtype=np.float32)
        terminated = np.zeros(n, dtype=bool)
        valid = np.zeros(n, dtype=bool)
        starts = np.zeros(n + 1, dtype=bool)
        state = np.zeros_like(episode.states[0])
        for p in range(n + 1):
            e = start + p
            if e == 0:
                starts[p] = True
            if 0 <= e < end:
                i = e - offset
                obs[p] = episode.obs[i]
                if p < n:
                    actions[p] = episode.actions[i]
                    rewards[p] = episode.rewards[i]
                    terminated[p] = episode.terminated[i]
                    valid[p] = True
            elif e == end and final is not None:
                obs[p] = final
        if start >= 0:
            state = episode.states[start - offset]
        return {
            "obs": obs,
            "actions": actions,
            "rewards": rewards,
            "terminated": terminated,
            "valid": valid,
            "starts": starts,
            "state": np.array(state),
        }

    def state_dict(self) -> dict[str, Any]:
        return {"episodes": [episode.state_dict() for episode in self.episodes]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for episode, saved in zip(self.episodes, state["episodes"], strict=True):
            episode.load_state_dict(saved)
