"""Complete, atomic, pickle-free checkpoints.

Layout of a run directory::

    run_dir/config.json                 the run's config (also inside every checkpoint)
    run_dir/checkpoints/step_<N>/       one checkpoint: meta.json, config.json, state.pt
    run_dir/checkpoints/latest          name of the newest complete checkpoint

A checkpoint is written into a temporary directory and renamed into place, so a crash while
saving never leaves a half-written checkpoint under a real name, and ``latest`` only ever
points at a complete one. ``state.pt`` is read with ``torch.load(weights_only=True)``: numpy
arrays are stored as tensors with their dtype, so no arbitrary object is unpickled.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from shoal.core.errors import CheckpointError
from shoal.core.imports import add_import_dirs

FORMAT_VERSION = 1
_ARRAY_TAG = "__ndarray__"


@dataclass(frozen=True)
class RunState:
    """What a run's ``state.pt`` holds, by part; written by the training session
    (`save_checkpoint`) and read back as `Checkpoint.run_state`. The layout is known here
    only: other modules read a checkpoint's parts by these names, not by string keys."""

    algorithm: dict[str, Any]
    """The algorithm's own state (`shoal.core.interfaces.Algorithm.state_dict`): its learner,
    sampler, replay and counters under names it chooses, and its deployable policy under
    ``policy``: ``{"model": weights, "obs_stats": observation statistics or None}``."""
    rng: dict[str, Any]
    """The global generators' states (`shoal.core.seeding.rng_state`)."""
    loop: dict[str, Any]
    """The training loop's counters (`shoal.train.session.LoopState`)."""
    callbacks: list[Any] | None
    """The callbacks' states, in their order (`shoal.train.callbacks`)."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "algorithm": self.algorithm,
            "rng": self.rng,
            "loop": self.loop,
            "callbacks": self.callbacks,
        }


@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint as read (`load_checkpoint`). Its parts are read through the properties
    below (the run's algorithm and progress, its deployable policy, its run state); ``meta``
    and ``state`` are the raw files, for this module."""

    path: Path
    meta: dict[str, Any]
    config: dict[str, Any]
    """The run's config as JSON data (`shoal.config.from_dict` reads it)."""
    state: dict[str, Any]

    @property
    def algo(self) -> str:
        """The registered name of the algorithm that wrote it."""
        return str(self.meta.get("algo"))

    @property
    def env_steps(self) -> int:
        """The run's progress when it was written (what ``run.total_steps`` counts)."""
        return int(self.meta["env_steps"])

    @property
    def joint(self) -> bool:
        """Its policy is several agent groups' acting together (`shoal.nn.policy.JointPolicy`)."""
        return bool(self.meta.get("joint"))

    @property
    def spaces(self) -> dict[str, Any] | None:
        """The deployed policy's spaces as JSON (``observation``, ``action``), where the run
        recorded them (`shoal.envs.spaces.space_from_json`)."""
        return self.meta.get("spaces")

    @property
    def run_state(self) -> RunState:
        """The whole state, by part (a `KeyError` names a missing part)."""
        return RunState(
            self.state["algorithm"], self.state["rng"], self.state["loop"],
            self.state.get("callbacks"),
        )  # fmt: skip

    @property
    def algorithm_state(self) -> dict[str, Any]:
        return self.state["algorithm"]

    @property
    def policy_weights(self) -> dict[str, Any]:
        """The deployable policy's weights (a `KeyError` where the run kept none)."""
        return self.state["algorithm"]["policy"]["model"]

    @property
    def policy_obs_stats(self) -> Any:
        """The deployable policy's observation statistics, or None."""
        return self.state["algorithm"]["policy"]["obs_stats"]

    @property
    def replay(self) -> dict[str, Any] | None:
        """The replay buffer's contents, where the run saved them (``replay.save``)."""
        algorithm = self.state.get("algorithm")
        return algorithm.get("replay") if isinstance(algorithm, dict) else None

    @property
    def replay_dropped(self) -> bool:
        """The algorithm keeps a replay but the run did not save it (``replay.save`` off): a
        resume refills it, and is not exact."""
        algorithm = self.state.get("algorithm")
        return isinstance(algorithm, dict) and "replay" in algorithm and algorithm["replay"] is None

    @property
    def self_play_pool(self) -> dict[str, Any] | None:
        """The self-play pool's state (`shoal.collect.self_play.SnapshotPool.state_dict`),
        wherever the algorithm's sampler keeps it; None without one."""
        return _find_pool(self.state.get("algorithm"))

    def setting(self, path: str, default: Any = None) -> Any:
        """The run's config value at the dotted ``path`` (``run.torch_threads``), or
        ``default`` where the saved config has none."""
        value: Any = self.config
        for part in path.split("."):
            if not isinstance(value, dict) or value.get(part) is None:
                return default
            value = value[part]
        return value


def _find_pool(state: Any) -> dict[str, Any] | None:
    if isinstance(state, dict):
        pool = state.get("pool")
        if isinstance(pool, dict) and "weights" in pool and "elo" in pool:
            return pool
        for value in state.values():
            found = _find_pool(value)
            if found is not None:
                return found
    return None


def encode(obj: Any) -> Any:
    """Replace numpy arrays by tagged tensors so the tree is loadable with weights_only."""
    if isinstance(obj, np.ndarray):
        # np.array, not np.ascontiguousarray: the latter turns 0-d arrays into shape (1,).
        return {
            _ARRAY_TAG: torch.from_numpy(np.array(obj, order="C")),
            "dtype": str(obj.dtype),
        }
    if isinstance(obj, dict):
        return {key: encode(value) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(encode(value) for value in obj)
    return obj


def decode(obj: Any) -> Any:
    if isinstance(obj, dict):
        if _ARRAY_TAG in obj:
            return obj[_ARRAY_TAG].numpy().astype(obj["dtype"], copy=False)
        return {key: decode(value) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(decode(value) for value in obj)
    return obj


def save_checkpoint(
    run_dir: Path,
    step: int,
    algo: str,
    config: dict[str, Any],
    state: RunState | dict[str, Any],
    keep: int = 3,
    extra_meta: dict[str, Any] | None = None,
) -> Path:
    """Write a checkpoint for env step ``step`` and prune all but the ``keep`` newest.
    ``state``: a run's `RunState` (any tree of tensors, arrays and plain data is stored).
    ``extra_meta`` goes into ``meta.json`` (JSON data: the policy's spaces, import paths).

    Crash-safe: the files are written into a temporary directory, flushed to disk (``fsync``,
    the directory too), and only then renamed into place, so a kill or a power loss leaves
    either the whole new checkpoint or none of it; older checkpoints are pruned only after
    the new one and ``latest`` are on disk. A write that fails (a full disk) removes the
    partial directory and raises; the checkpoints before it stay as they were."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".tmp-*"):  # the partial writes of saves killed before
        shutil.rmtree(stale, ignore_errors=True)
    final = root / f"step_{step:012d}"
    tmp = root / f".tmp-{uuid.uuid4().hex}"
    tmp.mkdir()
    meta = {"format_version": FORMAT_VERSION, "algo": algo, "env_steps": step, **(extra_meta or {})}
    try:
        _write_synced(tmp / "meta.json", json.dumps(meta, indent=2).encode())
        _write_synced(tmp / "config.json", json.dumps(config, indent=2).encode())
        with open(tmp / "state.pt", "wb") as handle:
            torch.save(encode(state.as_dict() if isinstance(state, RunState) else state), handle)
            handle.flush()
            os.fsync(handle.fileno())
        _fsync_dir(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _write_atomic(root / "latest", final.name)
    # Prune the oldest, never the one just written (a run resumed from an older checkpoint
    # may save below a newer one that is still there).
    for old in [p for p in sorted(root.glob("step_*")) if p != final][: -(keep - 1) or None]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def _fsync_dir(path: Path) -> None:
    """Flush a directory's entries (a rename into it) to disk, where the OS allows it."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # platforms that cannot open directories
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    _write_synced(tmp, text.encode())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint directory from either a run directory or a checkpoint directory."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"no such run or checkpoint directory: {path}")
    if (path / "state.pt").exists():
        return path
    root = path / "checkpoints"
    latest = root / "latest"
    if latest.exists():
        candidate = root / latest.read_text().strip()
        if (candidate / "state.pt").exists():
            return candidate
    found = sorted(root.glob("step_*/state.pt")) if root.exists() else []
    if not found:
        raise CheckpointError(f"{path} holds no checkpoint (expected {root}/step_*/state.pt)")
    return found[-1].parent


class _Unreadable(CheckpointError):
    """A checkpoint cut short or damaged (a kill mid-write on a file system that does not
    order renames, a disk fault, a hand edit): an older one may stand in for it."""


def checkpoint_candidates(path: Path) -> list[Path]:
    """The checkpoints of a run directory, the one ``latest`` names first, then the others
    newest first."""
    root = path / "checkpoints"
    found = sorted((p for p in root.glob("step_*") if p.is_dir()), reverse=True)
    latest = root / "latest"
    if latest.exists():
        named = root / latest.read_text().strip()
        if named in found:
            found.remove(named)
            found.insert(0, named)
    return found


def load_checkpoint(
    path: str | Path, algo: str | None = None, trust_code: bool = False, set_aside: bool = False
) -> Checkpoint:
    """Load and validate a checkpoint (a run directory's newest, or a checkpoint directory
    named); every failure is a `CheckpointError` saying why. Where a run's newest checkpoint
    is unreadable (cut short, damaged), the newest good one before it is used, with a one-line
    note; ``set_aside`` (a resume, which will write new ones) renames the unreadable newer
    ones to ``.unreadable-step_N`` so that they neither shadow nor outlast new checkpoints.
    The directories a checkpoint records for users' modules are imported from only with
    ``trust_code`` (`shoal.core.imports.add_import_dirs`)."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"no such run or checkpoint directory: {path}")
    named = any((path / f).exists() for f in ("meta.json", "state.pt"))
    if not (path / "checkpoints").is_dir() and (named or path.name.startswith("step_")):
        return _read_checkpoint(path, algo, trust_code)  # this checkpoint, and no other
    candidates = checkpoint_candidates(path)
    if not candidates:
        raise CheckpointError(
            f"{path} holds no checkpoint (expected {path / 'checkpoints'}/step_*/state.pt)"
        )
    unreadable: list[_Unreadable] = []
    for candidate in candidates:
        try:
            checkpoint = _read_checkpoint(candidate, algo, trust_code)
        except _Unreadable as exc:
            unreadable.append(exc)
            continue
        for skipped in unreadable:
            _note_once(f"note: {skipped}; using {checkpoint.path.name}, the newest good one")
        if set_aside:
            for bad in candidates[: candidates.index(candidate)]:
                if bad.name > candidate.name:
                    os.replace(bad, bad.with_name(f".unreadable-{bad.name}"))
        return checkpoint
    raise CheckpointError(
        f"{path} holds no readable checkpoint: " + "; ".join(str(exc) for exc in unreadable)
    )


_NOTED: set[str] = set()
"""The fallback notes this process has printed: a run loaded twice (``shoal eval`` reads its
checkpoint, then its policy) says so once."""


def _note_once(note: str) -> None:
    if note not in _NOTED:
        _NOTED.add(note)
        print(note)


def _first_sentence(exc: Exception) -> str:
    """An exception's message as one short line: its first sentence (PyTorch's reading
    errors add a paragraph of advice), at most 160 characters."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    head = text.split(". ", 1)[0].rstrip(".")
    return head if len(head) <= 160 else head[:157] + "..."


def _read_checkpoint(ckpt: Path, algo: str | None, trust_code: bool) -> Checkpoint:
    """One checkpoint directory, read and checked."""
    if not (ckpt / "state.pt").exists():
        raise _Unreadable(f"checkpoint {ckpt} is incomplete (no state.pt)")
    try:
        meta = json.loads((ckpt / "meta.json").read_text())
        config = json.loads((ckpt / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise _Unreadable(f"checkpoint {ckpt} is corrupted (metadata unreadable: {exc})") from exc
    version = meta.get("format_version")
    if version != FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {ckpt} has format version {version}; this shoal reads version "
            f"{FORMAT_VERSION}. Use the shoal version that wrote it."
        )
    if algo is not None and meta.get("algo") != algo:
        raise CheckpointError(
            f"checkpoint {ckpt} was written by {meta.get('algo')!r}, not {algo!r}"
        )
    try:
        state = decode(torch.load(ckpt / "state.pt", weights_only=True, map_location="cpu"))
    except Exception as exc:  # torch raises several types for truncated or foreign files
        raise _Unreadable(
            f"checkpoint {ckpt} is corrupted (state.pt unreadable: {_first_sentence(exc)})"
        ) from exc
    # Custom env modules imported from a run's working directory import again from here,
    # when the user trusts the run's code.
    add_import_dirs(meta.get("import_dirs", []), trust=trust_code)
    return Checkpoint(ckpt, meta, config, state)


def incompatible(path: Path, exc: Exception, changes: list[str] | None = None) -> CheckpointError:
    """The error for a checkpoint whose contents do not fit the model or algorithm built from
    its config: one resumed with another env or other networks (``changes``, from
    `config_changes`), else one written by a shoal version with another network layout."""
    detail = " ".join(str(exc).split()) or type(exc).__name__
    if len(detail) > 240:
        detail = detail[:240] + "..."
    if changes:
        return CheckpointError(
            f"checkpoint {path} does not fit the networks this resume builds: it changes "
            f"{', '.join(changes)}; a run resumes with the env and networks it trained with "
            f"(start a new run for another) ({detail})"
        )
    return CheckpointError(
        f"checkpoint {path} does not match the model this shoal builds from its config "
        f"({detail}); it was probably written by another shoal version"
    )


def config_changes(
    saved: dict[str, Any], current: dict[str, Any], blocks: tuple[str, ...] = ("env", "model")
) -> list[str]:
    """``field (old -> new)`` for each field of ``blocks`` (nested anywhere) whose value
    differs between a checkpoint's config and a resume's."""

    def flat(data: Any, prefix: str = "") -> dict[str, Any]:
        if not isinstance(data, dict):
            return {prefix: data}
        out: dict[str, Any] = {}
        for key, value in data.items():
            out.update(flat(value, f"{prefix}.{key}" if prefix else str(key)))
        return out

    old, new = flat(saved), flat(current)

    def shaping(name: str) -> bool:
        return any(part in blocks for part in name.split(".")[:-1])

    return [f"{k} ({old.get(k)!r} -> {new.get(k)!r})" for k in sorted(set(old) | set(new))
            if shaping(k) and old.get(k) != new.get(k)]  # fmt: skip
