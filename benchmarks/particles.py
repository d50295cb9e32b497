"""Particle-world throughput: shoal's built-in `spread` against mpe2's `simple_spread_v3` and
VMAS's `simple_spread`, in one process on one CPU thread, plus MAPPO training speed.

Measured, each as the median of ``--repeats`` timed blocks, with uniformly random discrete
actions (3 agents, 3 landmarks, 25-step episodes with resets included):

* **env-steps/s and agent-steps/s** at 1, 64 and 1024 parallel envs for
  - shoal ``shoal/spread-v0`` (numpy, all envs in one batched step),
  - mpe2 ``simple_spread_v3`` parallel envs (one Python env object per env, stepped in a loop:
    mpe2 has no batched implementation),
  - VMAS ``simple_spread`` on the CPU (torch, batched over envs).
* **MAPPO training env-steps/s** on ``shoal/spread-v0`` with 256 envs (rollout, GAE and the
  PPO update included), over a fixed budget.

Targets: >= 1,000,000 agent-steps/s for shoal at 1024 envs, and shoal faster than VMAS on the
CPU at 1024 envs.

Usage: ``python benchmarks/particles.py [--repeats 3] [--json out.json] [--quick]`` (needs
``pip install -e '.[pettingzoo,bench]'`` for mpe2 and vmas). See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

import shoal
from shoal.config import EnvConfig
from shoal.core.threads import set_compute_threads
from shoal.envs.make import make_multi_agent_env

AGENTS = 3
ENV_COUNTS = (1, 64, 1024)
TARGET_AGENT_STEPS = 1_000_000.0  # shoal spread, 1024 envs
MAPPO_ENVS = 256
TORCH_THREADS = 1


def steps_for(num_envs: int, quick: bool) -> int:
    """Vector steps per timed block: about 200k env steps at scale, fewer for a single env."""
    steps = max(50, min(2_000, 200_000 // num_envs))
    return max(10, steps // 10) if quick else steps


def time_block(step: Callable[[], None], steps: int) -> float:
    """Seconds for ``steps`` calls of ``step`` after a few untimed ones."""
    for _ in range(5):
        step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return time.perf_counter() - start


def shoal_spread(num_envs: int, steps: int, seed: int) -> float:
    env = make_multi_agent_env(EnvConfig(id="shoal/spread-v0", num_envs=num_envs))
    env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    group = next(iter(env.groups.values()))
    n_actions = int(group.action_space.n)
    actions = [rng.integers(n_actions, size=(num_envs, AGENTS)) for _ in range(16)]
    counter = iter(range(10**9))

    def step() -> None:
        env.step({group.name: actions[next(counter) % 16]})

    elapsed = time_block(step, steps)
    env.close()
    return num_envs * steps / elapsed


def mpe2_spread(num_envs: int, steps: int, seed: int) -> float:
    from mpe2 import simple_spread_v3

    envs = [simple_spread_v3.parallel_env(N=AGENTS, max_cycles=25) for _ in range(num_envs)]
    for i, env in enumerate(envs):
        env.reset(seed=seed + i)
    rng = np.random.default_rng(seed)

    def step() -> None:
        for env in envs:
            if not env.agents:
                env.reset()
            env.step({agent: int(rng.integers(5)) for agent in env.agents})

    elapsed = time_block(step, steps)
    for env in envs:
        env.close()
    return num_envs * steps / elapsed


def vmas_spread(num_envs: int, steps: int, seed: int) -> float:
    import vmas

    env = vmas.make_env(
        "simple_spread",
        num_envs=num_envs,
        device="cpu",
        continuous_actions=False,
        seed=seed,
        n_agents=AGENTS,
        max_steps=25,
        dict_spaces=False,
    )
    env.reset()
    generator = torch.Generator().manual_seed(seed)

    def step() -> None:
        actions = [torch.randint(5, (num_envs,), generator=generator) for _ in range(AGENTS)]
        _, _, dones, _ = env.step(actions)
        if dones.any():
            for index in torch.nonzero(dones).flatten().tolist():
                env.reset_at(index)

    elapsed = time_block(step, steps)
    return num_envs * steps / elapsed


def mappo_steps_per_s(total_steps: int, seed: int) -> float:
    """MAPPO on shoal/spread-v0 with 256 envs, the tuned example's learning settings; training
    env-steps/s over a fixed budget (no evaluation, no checkpoints)."""
    with tempfile.TemporaryDirectory(prefix="shoal-bench-") as tmp:
        result = shoal.train(
            tuned="mappo-spread",
            seed=seed,
            run_dir=str(Path(tmp) / "run"),
            **{
                "env.num_envs": MAPPO_ENVS,
                "run.total_steps": total_steps,
                "run.eval_every_steps": 0,
                "run.target_return": None,
                "run.checkpoint_every_steps": 0,
                "run.console": False,
                "run.tensorboard": False,
                "run.torch_threads": TORCH_THREADS,
            },
        )
    return result.env_steps / result.train_s


LIBRARIES: dict[str, Callable[[int, int, int], float]] = {
    "shoal": shoal_spread,
    "mpe2": mpe2_spread,
    "vmas": vmas_spread,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="timed blocks per measurement")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--quick", action="store_true", help="smoke check: short blocks")
    args = parser.parse_args(argv)
    set_compute_threads(TORCH_THREADS)
    repeats = 1 if args.quick else args.repeats

    rows: dict[str, dict[int, float]] = {name: {} for name in LIBRARIES}
    for num_envs in ENV_COUNTS:
        steps = steps_for(num_envs, args.quick)
        for name, measure in LIBRARIES.items():
            # mpe2 steps 1024 separate Python env objects per vector step: keep its block short.
            steps_here = max(2, steps // 20) if name == "mpe2" and num_envs > 64 else steps
            runs = [measure(num_envs, steps_here, seed) for seed in range(repeats)]
            rows[name][num_envs] = statistics.median(runs)
            print(
                f"  {name:<6} {num_envs:>5} envs  {rows[name][num_envs]:>12,.0f} env-steps/s  "
                f"{AGENTS * rows[name][num_envs]:>12,.0f} agent-steps/s",
                flush=True,
            )
    mappo_budget = 25_600 if args.quick else 256_000
    mappo = statistics.median(mappo_steps_per_s(mappo_budget, seed) for seed in range(repeats))
    print(f"  MAPPO spread, {MAPPO_ENVS} envs: {mappo:,.0f} training env-steps/s", flush=True)

    top = ENV_COUNTS[-1]
    shoal_agent_steps = AGENTS * rows["shoal"][top]
    checks = {
        "agent_steps_per_s": {
            "description": f"shoal spread agent-steps/s at {top} envs",
            "value": shoal_agent_steps,
            "target": TARGET_AGENT_STEPS,
            "pass": shoal_agent_steps >= TARGET_AGENT_STEPS,
        },
        "vs_vmas": {
            "description": f"shoal / VMAS (CPU) env-steps/s at {top} envs",
            "value": rows["shoal"][top] / rows["vmas"][top],
            "target": 1.0,
            "pass": rows["shoal"][top] > rows["vmas"][top],
        },
    }
    print_report(rows, mappo, checks)
    if args.json is not None:
        report = {
            "benchmark": "particles",
            "agents": AGENTS,
            "env_steps_per_s": {k: {str(n): v for n, v in r.items()} for k, r in rows.items()},
            "mappo_env_steps_per_s": mappo,
            "checks": checks,
            "repeats": repeats,
            "torch_threads": TORCH_THREADS,
        }
        args.json.write_text(json.dumps(report, indent=2))
        print(f"wrote {args.json}")
    return 0 if all(check["pass"] for check in checks.values()) else 1


def print_report(rows: dict[str, dict[int, float]], mappo: float, checks: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=100)
    table = Table(title=f"spread, {AGENTS} agents, random actions: env-steps/s (agent-steps/s)")
    table.add_column("library")
    for num_envs in ENV_COUNTS:
        table.add_column(f"{num_envs} envs", justify="right")
    for name, by_envs in rows.items():
        cells = [f"{by_envs[n]:,.0f} ({AGENTS * by_envs[n]:,.0f})" for n in ENV_COUNTS]
        table.add_row(name, *cells)
    console.print(table)
    console.print(f"MAPPO on shoal/spread-v0, {MAPPO_ENVS} envs: {mappo:,.0f} training env-steps/s")
    checks_table = Table(title="targets")
    for column in ("check", "value", "target", "result"):
        checks_table.add_column(column)
    for check in checks.values():
        big = check["target"] >= 1000
        value = f"{check['value']:,.0f}" if big else f"{check['value']:.2f}x"
        target = f">= {check['target']:,.0f}" if big else f"> {check['target']:.2f}x"
        checks_table.add_row(
            check["description"], value, target, "PASS" if check["pass"] else "FAIL"
        )
    console.print(checks_table)


if __name__ == "__main__":
    sys.exit(main())
