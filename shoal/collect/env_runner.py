"""EnvRunner: steps a vector env with its own copy of the policy and fills rollouts.

The runner owns everything a sampling process needs (env, policy copy, storage) and is
constructed from plain config values, so the same class can run in-process (`LocalSampler`) or
as a remote actor (the Ray sampler of a later issue).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch import nn

from shoal.config import EnvConfig
from shoal.core.errors import ConfigError
from shoal.core.interfaces import Weights
from shoal.core.threads import set_compute_threads
from shoal.core.types import EpisodeStats, Rollout, StepResult, merge_info
from shoal.data.rollout import RolloutStorage
from shoal.envs import make_env
from shoal.envs.base import find_wrapper, set_env_attr
from shoal.envs.normalize import NormalizeObservation
from shoal.envs.snapshot import EnvStateUnsupported
from shoal.fast import backend
from shoal.nn.recurrent import is_recurrent

ModelFn = Callable[[Any, Any], nn.Module]
"""``model_fn(observation_space, action_space)``: the policy network a runner acts with
(`ActorCritic`, DQN's `QNetwork`, ...): an ``nn.Module`` with ``act(obs, deterministic)`` (and
``action_mask=`` when the env reports legal actions) and ``value(obs)``; recurrent ones add
``initial_state``, ``step`` and ``step_value``."""


class EnvRunner:
    def __init__(
        self,
        env_config: EnvConfig,
        model_fn: ModelFn,
        num_steps: int,
        seed: int,
        torch_seed: int | None = None,
        acting: str = "auto",
        compiled: bool = False,
        own_torch_seed: int | None = None,
        obs_stats: dict[str, Any] | None = None,
    ):
        """``acting``: the ``model.backend`` the runner acts with (`shoal.fast.backend.actor`);
        ``compiled``: compile the acting network's forward (``run.compile``); ``obs_stats``:
        frozen statistics for the observation normalizer (``env.normalize_obs``), which then
        never updates them (an offline learner's dataset's, online).

        Random draws (the actions sampled): ``torch_seed`` seeds the process's torch
        generator, which a runner in its own process (a Ray actor) owns. ``own_torch_seed``
        gives an in-process runner a stream of its own, the one a Ray runner seeded
        ``torch_seed`` would draw: it is swapped in around the runner's own work (building,
        sampling), so the learner's draws in between do not move it and the runner samples
        what a Ray runner with the same seeds samples. Neither: the runner draws from the
        process's generator with everything else."""
        self.owns_torch_rng = torch_seed is not None
        self._own_rng: torch.Tensor | None = None
        """The in-process runner's generator state while it is swapped out."""
        if self.owns_torch_rng:
            # Seeding the process's generator makes the action samples depend on the seeds
            # only (checkpoints carry the generator's state, so a resumed run samples the
            # same actions).
            torch.manual_seed(torch_seed)
            set_compute_threads(1)
        elif own_torch_seed is not None:
            self._own_rng = torch.Generator().manual_seed(own_torch_seed).get_state()
        with self._torch_stream():
            self.env = make_env(env_config)
            if obs_stats is not None:
                freeze_obs_stats(self.env, obs_stats)
            # An nn.Module; recurrent ones add initial_state/step/step_value, exploring ones
            # exploration_state: members by kind, hence Any.
            model: Any = model_fn(self.env.observation_space, self.env.action_space)
        self.model = model
        self.model.requires_grad_(False)
        act_with_running_statistics(self.model)
        # Small MLP actor-critics act through NumPy (`shoal.fast`) unless told otherwise: the
        # same actions from the same random draws at a fraction of the per-step cost.
        self.actor = backend.actor(self.model, "torch" if compiled else acting)
        if compiled:
            self.model.compile()
        self.obs = self.env.reset(seed=seed)
        self.storage = RolloutStorage(
            num_steps,
            self.env.num_envs,
            self.env.observation_space,
            self.env.action_space,
            action_mask=self.env.action_mask is not None,
        )
        self.num_steps = num_steps
        self._weight_targets: dict[str, torch.Tensor] | None = None
        self.recurrent = is_recurrent(self.model)
        self.policy_state: torch.Tensor | None = None
        """Recurrent models: the state ``[B, ...]`` before the pending observation."""
        if self.recurrent:
            if self.storage.action_mask is not None:
                raise ConfigError(
                    "recurrent models do not support action masks yet; "
                    "set env.action_mask to none or model.lstm_hidden to None"
                )
            self.policy_state = self.model.initial_state(self.env.num_envs)

    @property
    def num_envs(self) -> int:
        return self.env.num_envs

    def set_weights(self, weights: Weights) -> None:
        # After one checked load_state_dict, weights under the same names copy straight into
        # place: its module walk and checks cost more than the copies on a small model, and
        # the learner sends the same layout every time.
        targets = self._weight_targets
        if targets is not None and targets.keys() == weights.keys():
            with torch.no_grad():
                torch._foreach_copy_(list(targets.values()), [weights[k] for k in targets])
            return
        self.model.load_state_dict(weights)
        self._weight_targets = self.model.state_dict(keep_vars=True)

    def set_env_attr(self, name: str, value: Any) -> None:
        """Set ``name`` to ``value`` in every env of this runner (`set_env_attr`)."""
        set_env_attr(self.env, name, value)

    def describe(self) -> dict[str, Any]:
        """What a sampler in another process needs to know of this runner's envs."""
        return {
            "observation_space": self.env.observation_space,
            "action_space": self.env.action_space,
            "num_envs": self.env.num_envs,
            "agents_per_env": self.env.agents_per_env,
            "action_masked": self.storage.action_mask is not None,
        }

    def obs_stats(self) -> dict[str, Any] | None:
        """The observation normalizer's statistics (None without normalization): a deployed
        policy applies them, frozen."""
        wrapper = find_wrapper(self.env, NormalizeObservation)
        return wrapper.stats.state_dict() if wrapper is not None else None

    @contextlib.contextmanager
    def _torch_stream(self) -> Iterator[None]:
        """Draw from this runner's own stream inside (``own_torch_seed``; else a no-op)."""
        if self._own_rng is None:
            yield
            return
        outer = torch.get_rng_state()
        torch.set_rng_state(self._own_rng)
        try:
            yield
        finally:
            self._own_rng = torch.get_rng_state()
            torch.set_rng_state(outer)

    def sample(self) -> tuple[Rollout, EpisodeStats]:
        """Step all envs ``num_steps`` times; returns the rollout and finished episodes."""
        with self._torch_stream():
            return self._sample()

    @torch.inference_mode()
    def _sample(self) -> tuple[Rollout, EpisodeStats]:
        if self.recurrent:
            return self._sample_recurrent()
        storage, env, model, actor = self.storage, self.env, self.model, self.actor
        episodes = FinishedEpisodes()
        masked = storage.action_mask is not None
        for t in range(self.num_steps):
            if masked:
                obs = storage.write_obs(t, self.obs)
                assert env.action_mask is not None  # the storage has masks when the env does
                mask = storage.write_action_mask(t, env.action_mask)
                out = model.act(obs, action_mask=mask)
            else:
                out = actor.act(storage.write_obs_array(t, self.obs))
            result = env.step(_array(out.actions))
            storage.write_step(t, out, result)
            self.obs = result.obs
            episodes.add(result)
        last_obs = np.array(self.obs, dtype=storage.obs_dtype)  # a copy: envs reuse buffers
        rollout = storage.rollout(
            _tensor(actor.value(last_obs)), last_obs=torch.from_numpy(last_obs)
        )
        return rollout, episodes.stats(getattr(env, "agent_names", None))

    def _sample_recurrent(self) -> tuple[Rollout, EpisodeStats]:
        """`sample` for recurrent models: the state goes from step to step and is zeroed for
        the envs whose step was an autoreset, so the next observation, the first of a new
        episode, starts from zeros. (The autoreset step itself still sees the old episode's
        state: its observation is that episode's final one, whose value bootstraps it.)"""
        storage, env, model = self.storage, self.env, self.model
        episodes = FinishedEpisodes()
        initial = state = self.policy_state
        assert state is not None  # set in __init__ for recurrent models
        step_states = None
        if getattr(model, "stores_step_states", False):
            step_states = torch.empty(self.num_steps, *state.shape, dtype=state.dtype)
        for t in range(self.num_steps):
            if step_states is not None:
                step_states[t] = state
            out, state = model.step(storage.write_obs(t, self.obs), state)
            result = env.step(out.actions.numpy())
            storage.write_step(t, out, result)
            if result.autoreset.any():
                keep = torch.as_tensor(~result.autoreset, dtype=state.dtype)
                state = state * keep.view(-1, *([1] * (state.dim() - 1)))
            self.obs = result.obs
            episodes.add(result)
        self.policy_state = state
        last_obs = torch.tensor(self.obs, dtype=storage.obs.dtype)
        rollout = storage.rollout(model.step_value(last_obs, state), initial, last_obs)
        if step_states is not None:
            rollout = rollout._replace(step_states=step_states)
        return rollout, episodes.stats(getattr(env, "agent_names", None))

    def get_state(self) -> dict[str, Any]:
        """Env state and the pending observation; ``env`` is None when it cannot be saved.
        Recurrent models add their state ``policy_state``."""
        try:
            env_state = self.env.get_state()
        except EnvStateUnsupported:
            env_state = None
        state: dict[str, Any] = {"env": env_state, "obs": np.array(self.obs)}
        if self.policy_state is not None:  # recurrent models
            state["policy_state"] = self.policy_state.clone()
        if hasattr(self.model, "exploration_state"):  # e.g. an Ornstein-Uhlenbeck process
            state["exploration"] = self.model.exploration_state()
        if self.owns_torch_rng:
            state["torch_rng"] = torch.get_rng_state()
        elif self._own_rng is not None:
            state["torch_rng"] = self._own_rng.clone()
        return state

    def set_state(self, state: dict[str, Any], fallback_seed: int) -> bool:
        """Restore mid-episode state; returns False when episodes had to restart instead."""
        if state.get("env") is None:
            self.obs = self.env.reset(seed=fallback_seed)
            if self.recurrent:
                self.policy_state = self.model.initial_state(self.env.num_envs)
            return False
        self.env.set_state(state["env"])
        self.obs = np.asarray(state["obs"]).copy()
        if self.recurrent:
            self.policy_state = state["policy_state"].clone()
        if "exploration" in state:
            self.model.load_exploration_state(state["exploration"])
        if self.owns_torch_rng and "torch_rng" in state:
            torch.set_rng_state(state["torch_rng"])
        elif self._own_rng is not None and "torch_rng" in state:
            self._own_rng = state["torch_rng"].clone()
        return True

    def close(self) -> None:
        self.env.close()


class FinishedEpisodes:
    """The episodes that end during a rollout, gathered step by step (`add`), then as one
    `EpisodeStats` (`stats`)."""

    def __init__(self) -> None:
        self.returns: list[np.ndarray] = []
        self.lengths: list[np.ndarray] = []
        self.agents: list[np.ndarray] = []
        self.infos: list[dict[str, np.ndarray] | None] = []

    def add(self, result: StepResult) -> None:
        """The episodes (and the env's episode statistics) of one vector step."""
        if result.episode_returns.size:
            self.returns.append(result.episode_returns)
            self.lengths.append(result.episode_lengths)
            if result.episode_agents is not None:
                self.agents.append(result.episode_agents)
        if result.episode_info is not None:
            self.infos.append(result.episode_info)

    def stats(self, agent_names: tuple[str, ...] | None) -> EpisodeStats:
        """The finished episodes; per agent when the env's rows are agents
        (``agent_names``)."""
        return EpisodeStats(
            _concat(self.returns),
            _concat(self.lengths, np.int64),
            _concat(self.agents, np.int64) if agent_names is not None else None,
            agent_names,
            merge_info(self.infos),
        )


BATCH_NORMS = (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d, torch.nn.BatchNorm3d)


def act_with_running_statistics(model: Any) -> None:
    """Put the batch-norm layers of an acting copy (Lamb et al.'s Models 2 and 3) in eval
    mode: they normalize with their running statistics, so one env's action does not depend
    on the other envs' observations in the batch, and acting leaves the statistics alone. The
    rest of the model keeps its mode (noisy layers go on exploring)."""
    for module in model.modules():
        if isinstance(module, BATCH_NORMS):
            module.eval()


def _array(x: torch.Tensor | np.ndarray) -> np.ndarray:
    return x.numpy() if isinstance(x, torch.Tensor) else x


def _tensor(x: torch.Tensor | np.ndarray) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x
    return torch.from_numpy(np.asarray(x, dtype=np.float32))


def _concat(parts: list[np.ndarray], dtype: type = np.float64) -> np.ndarray:
    return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)


def freeze_obs_stats(env: Any, stats: dict[str, Any]) -> None:
    """Standardize ``env``'s observations with ``stats``, frozen (its `NormalizeObservation`
    stops updating them)."""
    wrapper = find_wrapper(env, NormalizeObservation)
    if wrapper is None:
        raise ConfigError("frozen observation statistics need env.normalize_obs")
    wrapper.stats.load_state_dict(stats)
    wrapper.training = False
