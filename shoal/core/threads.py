"""One setting for the compute threads of both libraries shoal computes with."""

from __future__ import annotations

import torch
from threadpoolctl import threadpool_limits


def set_compute_threads(threads: int) -> None:
    """Set torch's intra-op threads and NumPy's BLAS threads (the matmuls of the NumPy
    backend, `shoal.fast`) to ``threads``, for this process.

    OpenBLAS otherwise starts a thread per core for matrices as small as 256 x 64: slower on
    these sizes when the machine is idle, and far slower when another process holds a core
    (measured: 45 ms against 14 ms per PPO iteration on CartPole with the zoo settings, 2 cores,
    one of them busy)."""
    torch.set_num_threads(threads)
    threadpool_limits(threads, user_api="blas")
