"""What data-parallel learners share through ``torch.distributed``: joining a process group,
averaging gradients and agreeing that the losses are finite. DD-PPO's ranks and the learner
groups of ``run.learners`` (`shoal.algos.cores.learner_group`) use these; every collective is
torch's own (`torch.distributed.all_reduce`), none is written here by hand.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence
from datetime import timedelta

import torch
import torch.distributed as dist

from shoal.core.errors import NaNLossError

COLLECTIVE_TIMEOUT = timedelta(minutes=5)
"""How long a rank waits in a collective for the others before failing (gloo's default of
30 minutes would hang a run whose learner died for that long)."""


def free_port() -> int:
    """A TCP port free on this machine now, for the other ranks to rendezvous at."""
    with socket.socket() as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def join(
    address: tuple[str, int], rank: int, world_size: int, device: torch.device, own_gpu: bool
) -> str:
    """Join the process group at ``address`` (rank 0's host and port): NCCL for the gradients
    when every rank has a GPU of its own (``own_gpu``), gloo otherwise. NCCL refuses two ranks
    on one device, which is what more learners than GPUs means (Ray gives each a share of
    one); gloo all-reduces CUDA tensors through the host instead. Returns the backend."""
    host, port = address
    nccl = device.type == "cuda" and own_gpu
    if nccl:  # the few host-side collectives go through gloo
        torch.cuda.set_device(device)
    backend = "cuda:nccl,cpu:gloo" if nccl else "gloo"
    dist.init_process_group(
        backend,
        init_method=f"tcp://{host}:{port}",
        rank=rank,
        world_size=world_size,
        timeout=COLLECTIVE_TIMEOUT,
    )
    return "nccl" if nccl else "gloo"


def leave() -> None:
    """Leave the process group (a no-op outside one)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def average_gradients(parameters: Sequence[torch.Tensor], weight: float) -> None:
    """Replace every ``.grad`` by the weighted sum over the ranks, ``sum_r weight_r * grad_r``,
    in one all-reduce of the flattened gradients. With ``weight`` = 1 / world size it is the
    mean (DD-PPO: equal batches); with ``weight`` = this rank's share of a batch split among
    the ranks it is the gradient of the whole batch's mean loss. Parameters without a
    gradient are left out: all ranks run the same graph, so they leave out the same ones."""
    grads = [p.grad for p in parameters if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    if weight != 1.0:
        flat *= weight
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def agree_finite(losses: Mapping[str, torch.Tensor], who: str = "a learner") -> None:
    """Raise `NaNLossError` on every rank when a loss is not finite on any of them, before
    the gradient all-reduce (a rank stopping alone would leave the others waiting in it)."""
    finite = torch.isfinite(torch.stack([v.detach().float() for v in losses.values()])).all()
    agreed = finite.to(torch.float32).reshape(1).cpu()
    dist.all_reduce(agreed, op=dist.ReduceOp.MIN)
    if agreed.item() < 1:
        bad = [k for k, v in losses.items() if not torch.isfinite(v)]
        where = f"loss/{bad[0]} became {losses[bad[0]].item()}" if bad else "a loss"
        raise NaNLossError(f"{where} on {who}; weights left unchanged")


def global_mean(values: torch.Tensor) -> torch.Tensor:
    """The mean of ``values`` over every rank's rows where this process is a rank of a
    data-parallel learner (a process group is up), else their mean; without gradient. A
    statistic of the whole batch that a loss takes (TD3+BC's mean |Q|) then stays the whole
    batch's when the batch is split among the ranks."""
    values = values.detach()
    if not dist.is_initialized():
        return values.mean()
    total = torch.stack([values.sum(), torch.tensor(float(values.numel()), device=values.device)])
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total[0] / total[1]


def weighted_sum(value: torch.Tensor, weight: float) -> torch.Tensor:
    """``sum_r weight_r * value_r`` over the ranks, without gradient: with ``value`` a mean
    over rank r's rows and ``weight`` its share of them, the mean over the whole batch (a
    scalar, or a vector such as a gradient or a Fisher-vector product). Every rank gets the
    same result, so decisions taken on it (a line search's) agree."""
    total = (value.detach() * weight).reshape(-1)
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total.reshape(value.shape)


def smallest(value: int) -> int:
    """The smallest of every rank's ``value``."""
    size = torch.tensor([value])
    dist.all_reduce(size, op=dist.ReduceOp.MIN)
    return int(size)
