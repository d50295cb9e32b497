"""Offline datasets: whole episodes in Minari's format (Younis et al. 2024, "Minari: a
dataset API for offline reinforcement learning"; the maintained successor of D4RL), read
without building their environment, and laid out as a `ReplayBuffer` for learners to sample.

A dataset is a directory holding ``data/main_data.hdf5`` and ``data/metadata.json``, as
Minari writes them, so ``minari.MinariDataset(DIR / "data")`` opens what shoal writes and
shoal reads any local Minari dataset. Each episode stores ``T + 1`` observations (the last
is the observation after the final action, the one a truncated episode bootstraps from),
``T`` actions, rewards, terminations and truncations.

The metadata names the env (``env_spec`` when Gymnasium knows the id, and always the shoal
env settings under ``shoal_env``), and the reference scores ``ref_min_score`` (a random
policy's mean return) and ``ref_max_score`` (the collecting policy's), so every dataset shoal
writes has normalized scores: 0 for the random policy, 100 for the expert (Fu et al. 2020,
"D4RL: datasets for deep data-driven reinforcement learning").
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from shoal.core.errors import DatasetError
from shoal.data.replay import ReplayBuffer
from shoal.envs.normalize import RunningMeanStd, load_obs_stats, normalize

DATA_DIR = "data"


@dataclass
class Episode:
    """One episode's arrays: ``observations`` ``[T + 1, ...]``, ``actions`` ``[T, ...]``,
    ``rewards``, ``terminations`` and ``truncations`` ``[T]``."""

    observations: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    terminations: np.ndarray
    truncations: np.ndarray

    def __len__(self) -> int:
        return len(self.rewards)

    @property
    def score(self) -> float:
        return float(np.sum(self.rewards))


def _minari():
    try:
        import minari
        from minari.data_collector import EpisodeBuffer
        from minari.dataset.minari_storage import MinariStorage
    except ImportError as exc:
        raise DatasetError(
            f"offline datasets are stored with Minari: pip install 'shoal[offline]' ({exc})"
        ) from exc
    return minari, MinariStorage, EpisodeBuffer


def write_dataset(
    path: str | Path,
    episodes: list[Episode],
    observation_space: gym.Space,
    action_space: gym.Space,
    env: dict[str, Any],
    ref_min_score: float | None = None,
    ref_max_score: float | None = None,
    metadata: dict[str, Any] | None = None,
) -> Path:
    """Write ``episodes`` as a Minari dataset in the new directory ``path``; returns it.

    ``env``: the shoal env settings that reproduce the episodes' env (at least ``id``);
    ``metadata``: further JSON-able entries (how the data was collected). An existing
    ``path`` is refused: a dataset is never overwritten in place."""
    minari, storage_cls, buffer_cls = _minari()
    path = Path(path).resolve()  # Minari joins a relative data path onto itself
    if path.exists():
        raise DatasetError(f"{path} exists; name a new directory for the dataset")
    if not episodes:
        raise DatasetError("no episodes to write")
    env_spec = None
    if env["id"] in gym.registry and not env.get("kwargs"):
        env_spec = gym.spec(env["id"])
    path.mkdir(parents=True)
    try:
        storage = storage_cls.new(path / DATA_DIR, observation_space, action_space, env_spec)
        storage.update_episodes([
            buffer_cls(id=i, observations=np.asarray(e.observations),
                       actions=np.asarray(e.actions), rewards=np.asarray(e.rewards, np.float64),
                       terminations=np.asarray(e.terminations, bool),
                       truncations=np.asarray(e.truncations, bool), infos={})
            for i, e in enumerate(episodes)
        ])  # fmt: skip
        metadata = dict(metadata or {})
        name = str(env["id"]).replace("/", "-").replace(":", "-").lower()
        entries = {
            "dataset_id": metadata.pop("dataset_id", f"shoal/{name}-{path.name}-v0"),
            "minari_version": minari.__version__,
            "shoal_env": json.dumps(env),
            **metadata,
        }
        if ref_min_score is not None and ref_max_score is not None:
            entries["ref_min_score"] = float(ref_min_score)
            entries["ref_max_score"] = float(ref_max_score)
        storage.update_metadata(entries)
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)  # no half-written dataset left behind
        raise
    return path


def resolve_path(path: str | Path) -> Path:
    """The ``data`` directory of a dataset given as its directory, its ``data`` directory,
    or the id of a dataset in the local Minari root (``~/.minari/datasets``)."""
    candidate = Path(path)
    for option in (candidate / DATA_DIR, candidate):
        if (option / "metadata.json").is_file():
            return option
    if not candidate.exists() and "/" in str(path) and not str(path).startswith((".", "/")):
        minari, _, _ = _minari()
        from minari.storage.local import get_dataset_path

        local = Path(get_dataset_path(str(path))) / DATA_DIR
        if (local / "metadata.json").is_file():
            return local
    if not candidate.exists():
        hint = ""
        if candidate.parent.name == "datasets":
            hint = f" (a tuned example's: shoal collect --recipe {candidate.name})"
        raise DatasetError(f"no dataset at {path}: write one with `shoal collect`{hint}")
    raise DatasetError(
        f"{path} is not a Minari dataset: it has no {DATA_DIR}/metadata.json (write one with "
        "`shoal collect`)"
    )


def dataset_env(path: str | Path) -> dict[str, Any]:
    """The env settings a dataset records (``{}`` when none), from its metadata alone."""
    data = resolve_path(path)
    try:
        metadata = json.loads((data / "metadata.json").read_text())
    except (OSError, ValueError) as exc:
        raise DatasetError(f"cannot read {data / 'metadata.json'}: {exc}") from exc
    if "shoal_env" in metadata:
        return json.loads(metadata["shoal_env"])
    spec = metadata.get("env_spec")
    return {"id": json.loads(spec)["id"]} if isinstance(spec, str) else {}


@dataclass
class OfflineDataset:
    """A dataset's episodes, spaces and reference scores, read without building its env."""

    episodes: list[Episode]
    observation_space: gym.Space
    action_space: gym.Space
    env: dict[str, Any]
    """The shoal env settings of the data (``id`` at least); ``{"id": ...}`` from the
    Gymnasium spec for datasets other libraries wrote."""
    ref_min_score: float | None = None
    ref_max_score: float | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None

    @property
    def num_steps(self) -> int:
        return sum(len(e) for e in self.episodes)

    @property
    def env_id(self) -> str | None:
        return self.env.get("id")

    def returns(self) -> np.ndarray:
        return np.array([e.score for e in self.episodes])

    def normalized_score(self, score: float) -> float | None:
        """``100 * (score - random) / (expert - random)`` (D4RL's normalization), or None
        when the dataset records no reference scores."""
        low, high = self.ref_min_score, self.ref_max_score
        if low is None or high is None or high == low:
            return None
        return 100.0 * (score - low) / (high - low)

    def normalizes(self) -> bool:
        """Whether per-feature standardization applies: float vector observations."""
        space = self.observation_space
        return isinstance(space, gym.spaces.Box) and np.issubdtype(space.dtype, np.floating)

    def obs_stats(self) -> dict[str, Any]:
        """Per-feature mean and variance of every observation the actions were taken on, as
        a `RunningMeanStd` state (what deployed policies apply, frozen)."""
        stats = RunningMeanStd(tuple(self.observation_space.shape or ()))
        stats.update(np.concatenate([e.observations[:-1] for e in self.episodes]))
        return stats.state_dict()

    def to_replay(
        self,
        num_envs: int = 1,
        extra_capacity: int = 0,
        n_step: int = 1,
        seed: int = 0,
        obs_stats: dict[str, Any] | None = None,
        clip_obs: float = 10.0,
        device: torch.device | str | None = None,
    ) -> ReplayBuffer:
        """A `ReplayBuffer` holding every transition, ready to sample, with room for
        ``extra_capacity`` more (an online continuation's). Episodes are dealt to
        ``num_envs`` columns (the buffer's env axis) whole, each followed by its autoreset
        row, whose observation is the final one; observations are standardized with
        ``obs_stats`` and clipped to ``clip_obs`` when given."""
        columns: list[list[Episode]] = [[] for _ in range(num_envs)]
        lengths = np.zeros(num_envs, np.int64)
        for episode in self.episodes:  # whole episodes to the shortest column
            b = int(lengths.argmin())
            columns[b].append(episode)
            lengths[b] += len(episode) + 1
        rows = int(lengths.max()) + n_step  # n_step invalid rows: every step sampleable
        capacity_rows = rows + -(-extra_capacity // num_envs)
        replay = ReplayBuffer(
            capacity_rows * num_envs,
            num_envs,
            self.observation_space,
            self.action_space,
            n_step=n_step,
            seed=seed,
            device=device,
        )
        action_shape = replay.actions.shape[2:]
        storage = {
            "obs": np.zeros((rows, num_envs) + replay.obs.shape[2:], replay.obs.dtype),
            "actions": np.zeros((rows, num_envs) + action_shape, replay.actions.dtype),
            "rewards": np.zeros((rows, num_envs), np.float32),
            "terminated": np.zeros((rows, num_envs), bool),
            "truncated": np.zeros((rows, num_envs), bool),
            "valid": np.zeros((rows, num_envs), bool),
        }
        stats = None if obs_stats is None else load_obs_stats(obs_stats)
        for b, column in enumerate(columns):
            row = 0
            for e in column:
                steps = slice(row, row + len(e))
                obs = e.observations
                if stats is not None:
                    obs = normalize(obs, stats, clip_obs)
                storage["obs"][row : row + len(e) + 1, b] = obs
                storage["actions"][steps, b] = e.actions.reshape((len(e),) + action_shape)
                storage["rewards"][steps, b] = e.rewards
                storage["terminated"][steps, b] = e.terminations
                storage["truncated"][steps, b] = e.truncations
                storage["valid"][steps, b] = True
                row += len(e) + 1
        state = replay.state_dict()
        state.update(
            rows_written=rows,
            num_sampleable=int(storage["valid"].sum()),
            storage={**storage, "action_mask": None},
        )
        replay.load_state_dict(state)
        return replay


def read_dataset(path: str | Path) -> OfflineDataset:
    """Read a local Minari dataset (see `resolve_path`) without building its env: the spaces
    come from the dataset. Episodes whose last step is neither terminated nor truncated are
    read as truncated there (the data stopped, the episode did not end)."""
    data = resolve_path(path)
    _, storage_cls, _ = _minari()
    try:
        storage = storage_cls.read(data)
        metadata = dict(storage.metadata)
        raw = list(storage.get_episodes(range(storage.total_episodes)))
    except DatasetError:
        raise
    except Exception as exc:  # h5py, JSON and Minari's own errors on a damaged dataset
        raise DatasetError(
            f"cannot read the dataset at {data}: {type(exc).__name__}: {exc}"
        ) from exc
    obs_space, action_space = metadata.get("observation_space"), metadata.get("action_space")
    if not isinstance(obs_space, gym.spaces.Space) or not isinstance(
        action_space, gym.spaces.Space
    ):
        raise DatasetError(f"the dataset at {data} records no observation or action space")
    if isinstance(obs_space, (gym.spaces.Dict, gym.spaces.Tuple)):
        raise DatasetError(
            f"the dataset at {data} has {type(obs_space).__name__} observations; offline "
            "learning reads Box and Discrete observations"
        )
    if not raw:
        raise DatasetError(f"the dataset at {data} holds no episode")
    episodes = []
    for i, item in enumerate(raw):
        try:
            episode = Episode(
                observations=np.asarray(item["observations"]),
                actions=np.asarray(item["actions"]),
                rewards=np.asarray(item["rewards"], np.float32),
                terminations=np.asarray(item["terminations"], bool),
                truncations=np.asarray(item["truncations"], bool),
            )
        except (KeyError, TypeError) as exc:
            raise DatasetError(f"episode {i} of {data} is incomplete: {exc}") from exc
        n = len(episode)
        if len(episode.observations) != n + 1 or len(episode.actions) != n or n == 0:
            raise DatasetError(
                f"episode {i} of {data} has {len(episode.observations)} observations, "
                f"{len(episode.actions)} actions and {n} rewards (expected T + 1, T and T)"
            )
        if not (episode.terminations[-1] or episode.truncations[-1]):
            episode.truncations = episode.truncations.copy()
            episode.truncations[-1] = True
        episodes.append(episode)
    env = json.loads(metadata["shoal_env"]) if "shoal_env" in metadata else {}
    spec = metadata.get("env_spec")
    if not env and spec is not None:
        env = {"id": spec.id if hasattr(spec, "id") else json.loads(spec)["id"]}
    return OfflineDataset(
        episodes=episodes,
        observation_space=obs_space,
        action_space=action_space,
        env=env,
        ref_min_score=_float_or_none(metadata.get("ref_min_score")),
        ref_max_score=_float_or_none(metadata.get("ref_max_score")),
        metadata={k: v for k, v in metadata.items() if _plain(v)},
        path=data.parent if data.name == DATA_DIR else data,
    )


def _float_or_none(value: Any) -> float | None:
    return None if value is None else float(value)


def _plain(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool, list)) or value is None


def episodes_from_replay(state: dict[str, Any]) -> list[Episode]:
    """The episodes a saved `ReplayBuffer` state holds (``ReplayBuffer.state_dict()``), in
    the order they were stored, each env's column walked oldest row first. An episode the
    buffer had started overwriting keeps its stored steps; one still running at the newest
    row ends there, truncated (its last stored step, whose next observation is not stored, is
    dropped)."""
    if state.get("frames") is not None:
        raise DatasetError("a replay of stacked frames (Atari) cannot be exported as a dataset")
    if state["storage"].get("rewards") is not None and state["storage"]["rewards"].ndim > 2:
        raise DatasetError("a replay of per-agent rewards cannot be exported as a dataset yet")
    storage, rows, written = state["storage"], int(state["rows"]), int(state["rows_written"])
    stored = min(written, rows)
    order = (max(0, written - rows) + np.arange(stored)) % rows  # oldest row first
    obs, actions = storage["obs"][order], storage["actions"][order]
    rewards, valid = storage["rewards"][order], storage["valid"][order]
    terminated, truncated = storage["terminated"][order], storage["truncated"][order]
    episodes = []
    for b in range(obs.shape[1]):
        start = None
        for t in range(stored):
            if not valid[t, b]:
                start = None
                continue
            if start is None:
                start = t
            if t + 1 >= stored:  # the newest row: its next observation is not stored
                end = t - 1
                if end >= start:
                    episodes.append(_cut(obs, actions, rewards, terminated, b, start, end, True))
                break
            if terminated[t, b] or truncated[t, b]:
                episodes.append(_cut(obs, actions, rewards, terminated, b, start, t, False))
                start = None
    return episodes


def _cut(obs, actions, rewards, terminated, b, start, end, cut_short) -> Episode:
    """Steps ``start..end`` of column ``b`` as an episode (its last observation: row end+1's)."""
    steps = slice(start, end + 1)
    terminations = terminated[steps, b].copy()
    if cut_short:
        terminations[-1] = False
    truncations = np.zeros_like(terminations)
    truncations[-1] = not terminations[-1]
    return Episode(
        observations=obs[start : end + 2, b].copy(),
        actions=actions[steps, b].copy(),
        rewards=rewards[steps, b].astype(np.float32),
        terminations=terminations,
        truncations=truncations,
    )
