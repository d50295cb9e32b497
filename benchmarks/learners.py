"""Learner groups (``run.learners``): one learner against two, on CPUs with gloo.

In one run, on this machine (the scaling benchmark's row (b); `benchmarks/scaling.py` has the
runners' rows):

1. **Time per update** of PPO's learner on one fixed batch (``--batch`` samples of a
   HalfCheetah-sized observation, ``--epochs`` epochs of minibatches of ``--minibatch``) with
   an MLP of ``--hidden`` units: one learner in this process with one torch thread, and a
   learner group of ``--learners`` Ray actors (one torch thread each) whose every minibatch is
   split among them (`shoal.algos.cores.learner_group`). The group's time includes what its
   design costs: the batch through Ray's object store, the ranks' gradient all-reduce every
   step, and the synchronized copy pulled back after the update. Samples learned per second
   = batch x epochs / time per update; the speed-up is the group's over one learner's.
   The same group with ``run.learner_processes``: its ranks processes on this machine
   rather than Ray actors, timed in the same rounds.
2. **The split without Ray**: the group's arithmetic (`SplitStep` on every rank, the
   all-reduces) in forked gloo processes, none of Ray's hand-offs or background processes.
3. **This machine's ceiling**: ``--learners`` single learners training at once in processes
   of their own, with no communication at all. Cores that share caches, memory bandwidth and
   clocks slow each other down; the speed-up these reach is the most any group can reach here.
4. **All-reduce time**: one gloo all-reduce of the model's flattened gradient between two
   processes on this machine, as every gradient step of a two-learner group takes it.
5. **Projection to 8 GPUs**: a ring all-reduce moves 2 (n - 1) / n of the gradient's bytes
   through each GPU's links; at NCCL's bus bandwidth B (``--nccl-busbw-gbs``, an assumption
   the table states) a step's all-reduce takes 2 (n - 1) / n x bytes / B. With a step's
   compute time t on one GPU, n data-parallel GPUs take t / n + all-reduce per step: the
   projected speed-up is t / (t / n + all-reduce), shown for the step times given by
   ``--gpu-step-ms``.

6. **A replay learner's group**: SAC's learner, ``--replay-updates`` updates on a fixed replay
   batch of ``--replay-batch`` rows then the weights pulled back for the samplers (as an
   iteration does), one learner against a `ReplayLearnerGroup` of ``--learners`` whose every
   batch is split among them.

7. **RLlib's learner group** (``--rllib-python``): RLlib PPO's learner update with its local
   learner and with ``--learners`` learners, the same batch, minibatches, epochs and MLPs, on
   CartPole (the sizes that matter are the MLP's), in RLlib's own environment
   (`rllib_side.py learners`).

Each figure is the median of ``--repeats`` measurements. Usage:
``python benchmarks/learners.py [--hidden 1024 1024] [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
from datetime import timedelta
from pathlib import Path

import gymnasium as gym
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from shoal.algos.continuous.sac import SACLearner
from shoal.algos.cores.group_shares import SplitStep
from shoal.algos.cores.learner_group import LearnerGroup, ReplayLearnerGroup
from shoal.algos.cores.rollout_batch import RolloutBatch
from shoal.algos.policy_gradient.ppo import PPOConfig, PPOLearner
from shoal.config import EnvConfig, ModelConfig, RunConfig
from shoal.core.types import ReplayBatch
from shoal.distributed import require_ray
from shoal.distributed.collective import free_port
from shoal.registry import ALGORITHMS

OBS, ACTIONS = 17, 6  # HalfCheetah-v5's observation and action sizes
SPACES = (gym.spaces.Box(-10.0, 10.0, (OBS,)), gym.spaces.Box(-1.0, 1.0, (ACTIONS,)))
TARGET_EFFICIENCY = 0.8  # two learners: at least 0.8 of linear speed-up (1.6x one learner)


def fixed_batch(size: int) -> RolloutBatch:
    g = torch.Generator().manual_seed(0)
    return RolloutBatch(
        obs=torch.randn(size, OBS, generator=g),
        actions=torch.randn(size, ACTIONS, generator=g).clamp(-1, 1),
        log_probs=-5.0 + 0.1 * torch.randn(size, generator=g),
        values=torch.randn(size, generator=g),
        advantages=torch.randn(size, generator=g),
        returns=torch.randn(size, generator=g),
    )


def config(args: argparse.Namespace, learners: int, processes: bool = False) -> PPOConfig:
    return PPOConfig(
        run=RunConfig(
            learners=learners, torch_threads=1, device="cpu", learner_processes=processes
        ),  # fmt: skip
        env=EnvConfig(id="HalfCheetah-v5", num_envs=8),
        model=ModelConfig(hidden=tuple(args.hidden), backend="torch"),
        num_steps=args.batch // 8,
        num_epochs=args.epochs,
        minibatch_size=args.minibatch,
    )


def time_updates(learners: list, batch: RolloutBatch, repeats: int) -> list[float]:
    """Median seconds per ``update`` of each of ``learners``, timed in turn (one update of
    each per round, after a warm-up round), so that all of them see the machine of the same
    moments: its speed drifts by tens of percent over minutes."""
    for learner in learners:
        learner.update(batch, 1e-4, 0.2, 0.0)
    times: list[list[float]] = [[] for _ in learners]
    for _ in range(repeats):
        for learner, own in zip(learners, times, strict=True):
            start = time.perf_counter()
            learner.update(batch, 1e-4, 0.2, 0.0)
            own.append(time.perf_counter() - start)
    return [statistics.median(own) for own in times]


def replay_batch(size: int) -> ReplayBatch:
    g = torch.Generator().manual_seed(0)
    return ReplayBatch(
        obs=torch.randn(size, OBS, generator=g),
        actions=torch.rand(size, ACTIONS, generator=g) * 2 - 1,
        rewards=torch.randn(size, 1, generator=g),
        steps=torch.ones(size, dtype=torch.int64),
        terminated=torch.zeros(size, dtype=torch.bool),
        next_obs=torch.randn(size, OBS, generator=g),
        next_action_mask=None,
        weights=torch.ones(size),
        indices=torch.arange(size).numpy(),
    )


def sac_config(args: argparse.Namespace, learners: int):
    return ALGORITHMS["sac"].default_config(**{
        "run.learners": learners, "run.torch_threads": 1, "run.device": "cpu",
        "env.id": "HalfCheetah-v5", "model.hidden": tuple(args.hidden),
        "replay.batch_size": args.replay_batch,
    })  # fmt: skip


def time_replay_updates(learners: list, batch: ReplayBatch, updates: int, repeats: int):
    """Median seconds per update of each of ``learners`` over rounds of ``updates`` updates
    and one pull of the weights, timed in turn (as `time_updates`)."""
    times: list[list[float]] = [[] for _ in learners]
    for warm_up in (True, *([False] * repeats)):
        for learner, own in zip(learners, times, strict=True):
            start = time.perf_counter()
            for _ in range(updates):
                learner.update(batch)
            learner.get_weights()
            if not warm_up:
                own.append((time.perf_counter() - start) / updates)
    return [statistics.median(own) for own in times]


def parameters(args: argparse.Namespace) -> int:
    learner = PPOLearner(config(args, 1), *SPACES)
    return sum(p.numel() for p in learner.model.parameters())


def _all_reduce_rank(rank: int, port: int, numel: int, repeats: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
        timeout=timedelta(seconds=120),
    )  # fmt: skip
    try:
        flat = torch.randn(numel)
        for _ in range(3):
            dist.all_reduce(flat)
        times = []
        for _ in range(repeats):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(flat)
            times.append(time.perf_counter() - start)
        if rank == 0:
            with open(out, "w") as f:
                json.dump(statistics.median(times), f)
    finally:
        dist.destroy_process_group()


def all_reduce_seconds(numel: int, repeats: int) -> float:
    out = f"/tmp/shoal-allreduce-{os.getpid()}.json"
    args = (free_port(), numel, repeats, out)
    mp.start_processes(_all_reduce_rank, args=args, nprocs=2, join=True, start_method="fork")
    with open(out) as f:
        seconds = float(json.load(f))
    os.remove(out)
    return seconds


def _independent_rank(rank: int, args: argparse.Namespace, out: str) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    learner = PPOLearner(config(args, 1), *SPACES)
    (seconds,) = time_updates([learner], fixed_batch(args.batch), args.repeats)
    with open(f"{out}.{rank}", "w") as f:
        json.dump(seconds, f)


def independent_seconds(args: argparse.Namespace, processes: int) -> float:
    """Seconds per update of one learner while ``processes`` such learners run at once in
    processes of their own, with no communication: what the machine itself allows a group
    (its cores share caches, memory bandwidth and clocks), the ceiling of its speed-up."""
    out = f"/tmp/shoal-independent-{os.getpid()}"
    mp.start_processes(
        _independent_rank, args=(args, out), nprocs=processes, join=True, start_method="fork"
    )
    times = []
    for rank in range(processes):
        with open(f"{out}.{rank}") as f:
            times.append(float(json.load(f)))
        os.remove(f"{out}.{rank}")
    return statistics.median(times)


def _split_rank(rank: int, args: argparse.Namespace, port: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=args.learners,
        timeout=timedelta(seconds=300),
    )  # fmt: skip
    try:
        torch.manual_seed(0)
        learner = PPOLearner(config(args, 1), *SPACES)
        learner.step = SplitStep(learner, rank, args.learners)
        (seconds,) = time_updates([learner], fixed_batch(args.batch), args.repeats)
        if rank == 0:
            with open(out, "w") as f:
                json.dump(seconds, f)
    finally:
        dist.destroy_process_group()


def split_without_ray_seconds(args: argparse.Namespace) -> float:
    """Seconds per update of the group's split (`SplitStep` on every rank) in forked gloo
    processes, without Ray: the same arithmetic and all-reduces, none of Ray's hand-offs or
    background processes."""
    out = f"/tmp/shoal-split-{os.getpid()}.json"
    mp.start_processes(
        _split_rank,
        args=(args, free_port(), out),
        nprocs=args.learners,
        join=True,
        start_method="fork",
    )
    with open(out) as f:
        seconds = float(json.load(f))
    os.remove(out)
    return seconds


def rllib_updates(args: argparse.Namespace) -> dict:
    """RLlib PPO's learner update with its local learner and with ``--learners`` learners
    (`rllib_side.py learners`, in RLlib's own environment), the same sizes: medians over
    ``--repeats`` training iterations of its learner group's update call."""
    seconds = {}
    for learners in (0, args.learners):
        command = [args.rllib_python, str(Path(__file__).with_name("rllib_side.py")), "learners",
                   "--learners", str(learners), "--batch", str(args.batch), "--minibatch",
                   str(args.minibatch), "--epochs", str(args.epochs), "--repeats",
                   str(args.repeats), "--hidden", *map(str, args.hidden)]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": "1"}  # one torch thread, as shoal's learner
        proc = subprocess.run(command, capture_output=True, text=True, env=env)
        lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
        if not lines:
            raise RuntimeError(f"rllib_side.py learners failed:\n{proc.stderr[-3000:]}")
        seconds[learners] = statistics.median(json.loads(lines[0][len("RESULT ") :])["update_s"])
    version = subprocess.run([args.rllib_python, "-c", "import ray; print(ray.__version__)"],
                             capture_output=True, text=True).stdout.strip()  # fmt: skip
    one, group = seconds[0], seconds[args.learners]
    return {"version": version, "one_learner_s": one, "group_s": group, "speedup": one / group}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, nargs="+", default=[1024, 1024])
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--minibatch", type=int, default=1024)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--learners", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--replay-batch", type=int, default=1024)
    parser.add_argument("--replay-updates", type=int, default=8)
    parser.add_argument(
        "--nccl-busbw-gbs",
        type=float,
        default=350.0,
        help="assumed NCCL all-reduce bus bandwidth between 8 GPUs of a node",
    )
    parser.add_argument("--gpu-step-ms", type=float, nargs="+", default=[1.0, 5.0, 20.0])
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument(
        "--rllib-python",
        help="RLlib's environment's Python (make bench-scaling creates .venv-rllib): add "
        "RLlib PPO's learner update with its local learner and with --learners learners",
    )
    parser.add_argument("--quick", action="store_true", help="small model, one repeat (smoke)")
    args = parser.parse_args()
    if args.quick:
        args.hidden, args.batch, args.minibatch, args.repeats = [64], 512, 128, 1
        args.replay_batch, args.replay_updates = 128, 2
    torch.set_num_threads(1)
    batch = fixed_batch(args.batch)
    numel = parameters(args)
    steps = args.epochs * -(-args.batch // args.minibatch)

    torch.manual_seed(0)
    one = PPOLearner(config(args, 1), *SPACES)
    rw = require_ray()
    rw.connect(None, num_cpus=max(os.cpu_count() or 1, args.learners))
    torch.manual_seed(0)
    group = LearnerGroup(PPOLearner, config(args, args.learners), *SPACES)
    torch.manual_seed(0)
    processes = LearnerGroup(PPOLearner, config(args, args.learners, True), *SPACES)
    try:
        single, grouped, in_processes = time_updates([one, group, processes], batch,
                                                     args.repeats)  # fmt: skip
    finally:
        group.close()
        processes.close()
    torch.manual_seed(0)
    sac_one = SACLearner(sac_config(args, 1), *SPACES)
    torch.manual_seed(0)
    sac_group = ReplayLearnerGroup(SACLearner, sac_config(args, args.learners), *SPACES)
    try:
        sac_single, sac_grouped = time_replay_updates(
            [sac_one, sac_group], replay_batch(args.replay_batch), args.replay_updates,
            args.repeats,
        )  # fmt: skip
    finally:
        sac_group.close()
        rw.shutdown()
    reduce_s = all_reduce_seconds(numel, max(10, 4 * args.repeats))
    split = split_without_ray_seconds(args)
    # The ceiling beside one learner alone, measured again right before it.
    (alone,) = time_updates([PPOLearner(config(args, 1), *SPACES)], batch, args.repeats)
    independent = independent_seconds(args, args.learners)
    ceiling = args.learners * alone / independent

    samples = args.batch * args.epochs
    speedup = single / grouped
    efficiency = speedup / args.learners
    figures = {
        "model": {"hidden": args.hidden, "parameters": numel, "gradient_mb": numel * 4 / 1e6},
        "batch": args.batch, "minibatch": args.minibatch, "epochs": args.epochs,
        "steps_per_update": steps,
        "one_learner": {"s_per_update": single, "samples_per_s": samples / single},
        "group": {"learners": args.learners, "s_per_update": grouped,
                  "samples_per_s": samples / grouped},
        "speedup": speedup, "efficiency": efficiency,
        "split_without_ray": {"s_per_update": split, "speedup_over_alone": None},
        "learner_processes": {"s_per_update": in_processes, "speedup": single / in_processes,
                              "efficiency": single / in_processes / args.learners},
        "independent": {"s_per_update": independent, "alone_s": alone, "speedup": ceiling},
        "all_reduce_ms": reduce_s * 1e3,
        "all_reduce_share_of_step": reduce_s / (grouped / steps),
        "cpus": os.cpu_count(),
        "sac": {"batch": args.replay_batch, "updates_per_pull": args.replay_updates,
                "one_learner_s_per_update": sac_single, "group_s_per_update": sac_grouped,
                "speedup": sac_single / sac_grouped},
    }  # fmt: skip
    print(
        f"PPO learner update, MLP {args.hidden} ({numel:,} parameters, "
        f"{numel * 4 / 1e6:.1f} MB of gradient), batch {args.batch}, minibatch "
        f"{args.minibatch}, {args.epochs} epochs ({steps} gradient steps per update)"
    )
    print(f"  1 learner:  {single * 1e3:8.1f} ms/update  {samples / single:10,.0f} samples/s")
    print(f"  {args.learners} learners: {grouped * 1e3:8.1f} ms/update  "
          f"{samples / grouped:10,.0f} samples/s  speed-up {speedup:.2f}x "
          f"(efficiency {efficiency:.2f}, target >= {TARGET_EFFICIENCY})")  # fmt: skip
    print(
        f"  {args.learners} learners as processes (run.learner_processes): "
        f"{in_processes * 1e3:8.1f} ms/update  {samples / in_processes:10,.0f} samples/s  "
        f"speed-up {single / in_processes:.2f}x (efficiency "
        f"{single / in_processes / args.learners:.2f})"
    )
    figures["split_without_ray"]["speedup_over_alone"] = alone / split
    print(
        f"  the same split in forked gloo processes, without Ray: {split * 1e3:.1f} ms/update, "
        f"{alone / split:.2f}x one learner alone (measured beside it)"
    )
    print(
        f"  {args.learners} independent learners at once, no communication (this machine's "
        f"ceiling): {independent * 1e3:.1f} ms/update each against {alone * 1e3:.1f} alone, "
        f"{ceiling:.2f}x one learner's "
        f"samples/s (efficiency {ceiling / args.learners:.2f}); the group reaches "
        f"{speedup / ceiling:.0%} of it"
    )
    print(
        f"  gloo all-reduce of the gradient, 2 processes: {reduce_s * 1e3:.2f} ms "
        f"({figures['all_reduce_share_of_step']:.0%} of a group's gradient step)"
    )
    print(
        f"  SAC learner update, batch {args.replay_batch} (a {args.replay_updates}-update pull "
        f"of the weights each): 1 learner {sac_single * 1e3:.1f} ms/update, {args.learners} "
        f"learners {sac_grouped * 1e3:.1f} ms/update, speed-up {sac_single / sac_grouped:.2f}x"
    )
    gpus = 8
    ring = 2 * (gpus - 1) / gpus * numel * 4 / (args.nccl_busbw_gbs * 1e9)
    figures["projection"] = {"gpus": gpus, "nccl_busbw_gbs": args.nccl_busbw_gbs,
                             "all_reduce_ms": ring * 1e3, "speedups": {}}  # fmt: skip
    print(
        f"  projection to {gpus} GPUs: ring all-reduce 2*(n-1)/n * {numel * 4 / 1e6:.1f} MB / "
        f"{args.nccl_busbw_gbs:g} GB/s (assumed NCCL bus bandwidth) = {ring * 1e3:.3f} ms/step"
    )
    for step_ms in args.gpu_step_ms:
        t = step_ms / 1e3
        projected = t / (t / gpus + ring)
        figures["projection"]["speedups"][step_ms] = projected
        print(
            f"    a {step_ms:g} ms step on one GPU: {projected:.2f}x on {gpus} "
            f"(efficiency {projected / gpus:.2f})"
        )
    if args.rllib_python:
        rllib = rllib_updates(args)
        figures["rllib"] = rllib
        print(
            f"  RLlib {rllib['version']} PPO, the same batch, minibatches, epochs and MLPs "
            f"(CartPole's observations): its local learner {rllib['one_learner_s'] * 1e3:.1f} "
            f"ms/update, {args.learners} learners {rllib['group_s'] * 1e3:.1f} ms/update, "
            f"speed-up {rllib['speedup']:.2f}x; shoal's group against RLlib's: "
            f"{rllib['group_s'] / grouped:.2f}x faster"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2)
    best = max(efficiency, single / in_processes / args.learners)
    return 0 if best >= TARGET_EFFICIENCY or args.quick else 1


if __name__ == "__main__":
    raise SystemExit(main())
