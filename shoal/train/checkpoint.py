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

from shoal.errors import CheckpointError
from shoal.imports import add_import_dirs

FORMAT_VERSION = 1
_ARRAY_TAG = "__ndarray__"


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    meta: dict[str, Any]
    config: dict[str, Any]
    state: dict[str, Any]


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
    state: dict[str, Any],
    keep: int = 3,
    extra_meta: dict[str, Any] | None = None,
) -> Path:
    """Write a checkpoint for env step ``step`` and prune all but the ``keep`` newest.
    ``extra_meta`` goes into ``meta.json`` (JSON data: the policy's spaces, import paths)."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:012d}"
    tmp = root / f".tmp-{uuid.uuid4().hex}"
    tmp.mkdir()
    meta = {"format_version": FORMAT_VERSION, "algo": algo, "env_steps": step, **(extra_meta or {})}
    try:
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        torch.save(encode(state), tmp / "state.pt")
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _write_atomic(root / "latest", final.name)
    for old in sorted(root.glob("step_*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    tmp.write_text(text)
    os.replace(tmp, path)


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


def load_checkpoint(
    path: str | Path, algo: str | None = None, trust_code: bool = False
) -> Checkpoint:
    """Load and validate a checkpoint; every failure is a `CheckpointError` saying why. The
    directories it records for users' modules are imported from only with ``trust_code``
    (`shoal.imports.add_import_dirs`)."""
    ckpt = resolve_checkpoint(path)
    try:
        meta = json.loads((ckpt / "meta.json").read_text())
        config = json.loads((ckpt / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(
            f"checkpoint {ckpt} is corrupted (metadata unreadable: {exc})"
        ) from exc
    version = meta.get("format_version")
    if version != FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {ckpt} has format version {version}; this shoal reads version "
            f"{FORMAT_VERSION}. Use the shoal version that wrote it."
        )
    # Custom env modules imported from a run's working directory import again from here,
    # when the user trusts the run's code.
    add_import_dirs(meta.get("import_dirs", []), trust=trust_code)
    if algo is not None and meta.get("algo") != algo:
        raise CheckpointError(
            f"checkpoint {ckpt} was written by {meta.get('algo')!r}, not {algo!r}"
        )
    try:
        state = decode(torch.load(ckpt / "state.pt", weights_only=True, map_location="cpu"))
    except Exception as exc:  # torch raises several types for truncated or foreign files
        raise CheckpointError(
            f"checkpoint {ckpt} is corrupted (state.pt unreadable: {exc})"
        ) from exc
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
