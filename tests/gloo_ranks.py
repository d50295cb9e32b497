"""Two ranks of a gloo process group forked from the test (over localhost, no Ray): for the
tests that a learner group's ranks, each taking its share of an update, take the update one
learner takes. Forked, the children start with shoal already imported (spawning would import
it again, seconds)."""

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from shoal.distributed.collective import free_port


def _rank(rank: int, port: int, out_dir: str, work: Any, args: tuple) -> None:
    torch.set_num_threads(1)
    # A short timeout: a rank that fails must not leave the other waiting.
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
        timeout=timedelta(seconds=60),
    )  # fmt: skip
    try:
        torch.save(work(rank, *args), f"{out_dir}/{rank}.pt")
    finally:
        dist.destroy_process_group()


def on_two_ranks(work: Any, out_dir: Any, *args: Any) -> list[Any]:
    """``work(rank, *args)`` on each of two forked ranks of one gloo group; their results, in
    rank order (through files in ``out_dir``)."""
    run_args = (free_port(), str(out_dir), work, args)
    mp.start_processes(_rank, args=run_args, nprocs=2, join=True, start_method="fork")
    return [torch.load(f"{out_dir}/{r}.pt", weights_only=False) for r in range(2)]
