"""The shared noise table of the evolution strategies (Salimans et al. 2017, "Evolution
Strategies as a Scalable Alternative to Reinforcement Learning", sec. 2.1).

One block of standard normal float32 numbers, made once from a seed. A perturbation of a
``D``-parameter policy is the slice ``table[offset : offset + D]``, so the learner and its
workers exchange offsets (integers) instead of parameter vectors: each worker builds the same
table from the same seed (or reads one copy from Ray's object store) and reads the slices it
is told to.
"""

from __future__ import annotations

import os

import numpy as np

from shoal.core.errors import ConfigError

BYTES_PER_NUMBER = 4  # float32


def check_noise_size(size: int, dim: int) -> None:
    """Refuse a table that cannot hold one perturbation of ``dim`` numbers, or that would not
    fit in this machine's memory (a quarter of it at most: workers on one machine may each
    hold a copy while the object store holds another)."""
    if size < dim:
        raise ConfigError(
            f"noise_size = {size:,} is too small for the policy's {dim:,} parameters: it must "
            "be at least that (the references use 250,000,000)"
        )
    available = _memory_bytes()
    if available is not None and size * BYTES_PER_NUMBER > available // 4:
        raise ConfigError(
            f"noise_size = {size:,} needs {size * BYTES_PER_NUMBER / 2**30:.1f} GiB, more than a "
            f"quarter of this machine's {available / 2**30:.1f} GiB; choose a smaller noise_size"
        )


def _memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # platforms without sysconf
        return None


class NoiseTable:
    """``size`` standard normal float32 numbers from ``seed``; ``get(offset, dim)`` is a view.

    Offsets are drawn so that every slice of ``dim`` numbers lies inside the table. The same
    ``(seed, size)`` gives the same numbers on every machine (NumPy's PCG64 and its normal
    sampler are stable across platforms)."""

    def __init__(self, seed: int, size: int):
        self.seed, self.size = int(seed), int(size)
        rng = np.random.default_rng(self.seed)
        self.table = rng.standard_normal(self.size, dtype=np.float32)

    @classmethod
    def of(cls, table: np.ndarray) -> NoiseTable:
        """A table around numbers made elsewhere (a worker's read-only copy from Ray's object
        store), without drawing them again."""
        wrapped = cls.__new__(cls)
        wrapped.seed, wrapped.size, wrapped.table = -1, len(table), table
        return wrapped

    def get(self, offset: int, dim: int) -> np.ndarray:
        if not 0 <= offset <= self.size - dim:
            raise IndexError(f"offset {offset} + {dim} numbers lies outside a table of {self.size}")
        return self.table[offset : offset + dim]

    def rows(self, offsets: np.ndarray, dim: int) -> np.ndarray:
        """``[n, dim]``: the slices at ``offsets`` (a copy)."""
        return (
            np.stack([self.get(int(offset), dim) for offset in offsets])
            if len(offsets)
            else (np.zeros((0, dim), np.float32))
        )

    def sample_offsets(self, rng: np.random.Generator, dim: int, count: int) -> np.ndarray:
        """``count`` offsets drawn uniformly from those whose slice fits, as int64."""
        return rng.integers(0, self.size - dim + 1, size=count, dtype=np.int64)
