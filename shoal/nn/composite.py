"""The combined encoder of Dict and Tuple observations (`shoal.envs.composite.PackedObs`).

Each part of the observation gets its own encoder and the features are concatenated, the
network's hidden layers (``ModelConfig.hidden``) then read them as they read a flat vector:

* a float Box (a vector, or any shape, flattened): the values themselves, or a per-key MLP of
  ``ModelConfig.key_hidden`` layers when that is set;
* a uint8 Box of shape ``[C, H, W]`` or ``[H, W]`` (an image): the image encoder
  ``ModelConfig.encoder`` names (`shoal.nn.cnn`; ``nature`` when the encoder is ``mlp``, and
  when the image is smaller than the Nature CNN reads, 36x36, its pixels flattened and
  scaled to [0, 1] by the Box's high); uint8 1-D Boxes are vectors;
* Discrete ``n``: one-hot for ``n <= ONE_HOT_MAX``, else a learned embedding of
  ``EMBEDDING_DIM`` features; MultiDiscrete: the same for each element, concatenated;
* MultiBinary: the bits as floats.

The encoder reads the packed uint8 records ``[N, record_bytes]`` and takes each part as a
zero-copy view in its dtype, so storage and the transfer to a GPU move the compact records.
"""

from __future__ import annotations

from functools import cached_property

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from shoal.config import ModelConfig
from shoal.core.errors import ConfigError, ShoalError
from shoal.envs.composite import Leaf, PackedObs
from shoal.envs.shapes import as_box
from shoal.nn.cnn import image_encoder
from shoal.nn.mlp import MLP, width_of

ONE_HOT_MAX = 64
"""Discrete parts with more values than this are embedded instead of one-hot encoded."""
EMBEDDING_DIM = 32
IMAGE_ENCODERS = ("nature", "impala", "batchnorm-cnn2")


class Flatten(nn.Module):
    """The values as floats, flattened, times ``scale``."""

    def __init__(self, size: int, scale: float = 1.0):
        super().__init__()
        self.out_dim = size
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(start_dim=1).float()
        return x * self.scale if self.scale != 1.0 else x


class Categories(nn.Module):
    """One-hot (or embedded) values of ``counts`` categorical variables ``[N, len(counts)]``,
    concatenated; the values of each variable are ``0 .. counts[i] - 1``."""

    def __init__(self, counts: list[int]):
        super().__init__()
        self.counts = counts
        self.embeddings = nn.ModuleDict(
            {
                str(i): nn.Embedding(n, EMBEDDING_DIM)
                for i, n in enumerate(counts)
                if n > ONE_HOT_MAX
            }
        )
        self.out_dim = sum(EMBEDDING_DIM if n > ONE_HOT_MAX else n for n in counts)
        self.all_one_hot = not self.embeddings and len(set(counts)) == 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(x.shape[0], -1).long()
        if self.all_one_hot:  # one call for every variable
            return nn.functional.one_hot(x, self.counts[0]).flatten(start_dim=1).float()
        parts = []
        for i, n in enumerate(self.counts):
            column = x[:, i]
            if str(i) in self.embeddings:
                parts.append(self.embeddings[str(i)](column))
            else:
                parts.append(nn.functional.one_hot(column, n).float())
        return torch.cat(parts, dim=-1)


class KeyMLP(nn.Module):
    """A vector part's own MLP (``ModelConfig.key_hidden``)."""

    def __init__(self, inner: nn.Module, hidden: tuple[int, ...], activation: str):
        super().__init__()
        self.inner = inner
        self.mlp = MLP(width_of(inner), hidden, activation)
        self.out_dim = self.mlp.out_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.inner(x))


def leaf_encoder(leaf: Leaf, model: ModelConfig | None) -> nn.Module:
    """The encoder of one part of a composite observation (module docstring)."""
    space = leaf.space
    if leaf.is_image:
        name = "nature" if model is None or model.encoder == "mlp" else model.encoder
        if name not in IMAGE_ENCODERS:
            raise ConfigError(
                f"observation part {leaf.name!r} is an image {leaf.shape}; model.encoder "
                f"{name!r} cannot encode it inside a Dict/Tuple observation: use one of "
                f"{list(IMAGE_ENCODERS)} (or 'mlp', which picks 'nature')"
            )
        try:
            if model is None:
                return image_encoder(space, name)
            return image_encoder(space, name, model.precision, model.encoder_activation)
        except ConfigError as exc:
            if model is not None and model.encoder != "mlp":  # a CNN the user asked for
                raise ConfigError(f"observation part {leaf.name!r}: {exc}") from None
            # Smaller than the default CNN reads (MiniGrid's 7x7x3 grids): pixels as inputs.
            high = float(np.max(as_box(space).high)) or 1.0
            return Flatten(leaf.size, 1.0 / high)
    if isinstance(space, gym.spaces.Discrete):
        return Categories([int(space.n)])
    if isinstance(space, gym.spaces.MultiDiscrete):
        return Categories([int(n) for n in np.asarray(space.nvec).ravel()])
    inner = Flatten(int(np.prod(leaf.shape, dtype=np.int64)))
    if model is not None and model.key_hidden and isinstance(space, gym.spaces.Box):
        return KeyMLP(inner, tuple(model.key_hidden), model.activation)
    return inner


class CompositeEncoder(nn.Module):
    """Packed records ``[N, record_bytes]`` (uint8) -> features ``[N, out_dim]``: each part
    through its own encoder (`leaf_encoder`), concatenated in the space's order."""

    def __init__(self, space: PackedObs, model: ModelConfig | None = None):
        super().__init__()
        self.space = space
        self.leaves = space.leaves
        self.encoders = nn.ModuleList([leaf_encoder(leaf, model) for leaf in self.leaves])
        self.out_dim = sum(width_of(encoder) for encoder in self.encoders)
        self._numpy_parts = self._numpy_plan()

    def _numpy_plan(self) -> list[tuple[str, Leaf, float]] | None:
        """How `numpy_features` computes each part, or None when some part has weights (an
        embedding, a per-key MLP, an image encoder)."""
        plan = []
        for leaf, encoder in zip(self.leaves, self.encoders, strict=True):
            if isinstance(encoder, Flatten):
                kind = "float" if leaf.dtype == np.float32 and encoder.scale == 1.0 else "cast"
                plan.append((kind, leaf, encoder.scale))
            elif isinstance(encoder, Categories) and encoder.all_one_hot:
                plan.append(("one_hot", leaf, encoder.counts[0]))
            else:
                return None
        return plan

    @property
    def has_numpy_path(self) -> bool:
        return self._numpy_parts is not None

    def numpy_features(self, records: np.ndarray) -> np.ndarray:
        """`forward` in NumPy for encoders without weights (flattened vectors, one-hot
        discrete parts): what `shoal.fast.mlp` acts and trains on. Float parts are gathered
        with one indexing call from the records' float32 view."""
        if self._numpy_parts is None:
            raise ValueError("this composite encoder has weights; it has no NumPy path")
        if self._float_columns is not None:
            return records.view(np.float32)[:, self._float_columns]
        parts = []
        for kind, leaf, arg in self._numpy_parts:
            values = self.space.leaf_array(records, leaf).reshape(records.shape[0], -1)
            if kind == "float":
                parts.append(values)
            elif kind == "cast":
                cast = values.astype(np.float32)
                parts.append(cast * np.float32(arg) if arg != 1.0 else cast)
            else:  # one-hot; arg is the number of values
                eye = np.eye(int(arg), dtype=np.float32)
                parts.append(eye[values].reshape(records.shape[0], -1))
        return np.concatenate(parts, axis=1)

    @cached_property
    def _float_columns(self) -> np.ndarray | None:
        """Columns of the records' float32 view holding every part, when all are float."""
        if self._numpy_parts is None or any(k != "float" for k, _, _ in self._numpy_parts):
            return None
        return np.concatenate(
            [np.arange(leaf.offset // 4, leaf.offset // 4 + leaf.size) for leaf in self.leaves]
        )

    def forward(self, records: torch.Tensor) -> torch.Tensor:
        if records.dtype != torch.uint8 or records.shape[-1] != self.space.record_bytes:
            raise ShoalError(
                f"a Dict/Tuple observation encoder reads packed uint8 records "
                f"[N, {self.space.record_bytes}], got {records.dtype} {list(records.shape)}"
            )
        parts = [
            encoder(self.space.leaf_tensor(records, leaf))
            for leaf, encoder in zip(self.leaves, self.encoders, strict=True)
        ]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)
