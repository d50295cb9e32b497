"""One seed derives all others (DESIGN.md convention 9)."""

from __future__ import annotations

import zlib

import numpy as np
import torch


def derive_seed(seed: int, *path: str | int) -> int:
    """A 31-bit seed for the component named by ``path``, e.g. ``derive_seed(s, "env", 0)``.

    `numpy.random.SeedSequence` spreads nearby seeds apart, so runs seeded 0 and 1 do not share
    streams; strings are hashed with a stable CRC (Python's ``hash`` is salted per process).
    """
    key = tuple(p if isinstance(p, int) else zlib.crc32(p.encode()) for p in path)
    sequence = np.random.SeedSequence(seed, spawn_key=key)
    return int(sequence.generate_state(1, np.uint32)[0] >> 1)


def seed_torch(seed: int) -> None:
    torch.manual_seed(derive_seed(seed, "torch"))


def rng_state() -> dict[str, torch.Tensor]:
    """The global generator states shoal draws from: torch's CPU generator and, on a machine
    with GPUs, each GPU's (numpy draws use Generators owned by the environments, which are
    saved with the env state)."""
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.stack(torch.cuda.get_rng_state_all())
    return state


def set_rng_state(state: dict[str, torch.Tensor]) -> None:
    """Restore `rng_state`. GPU generators are restored where the machine has as many GPUs
    (a checkpoint moved to another machine resumes, with other GPU draws)."""
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(list(cuda))
