"""The 4-lane intersection (``shoal/intersection-v0``): simulation speed and the SUMO
validation.

``--speed``: env-steps/s and agent-steps/s (4 agents an env), uniformly random
lane-following actions, heavy background traffic (``traffic high``), resets included, each
figure the median of ``--repeats`` timed blocks of ``--seconds`` after 20 untimed steps:
the built-in simulator at 1, 64 and 1024 envs on one CPU thread; the SUMO backend with one
env in-process and with 4 envs in 4 worker processes; highway-env's
``intersection-multi-agent-v1`` with 4 controlled vehicles at 0.1 s steps when
``--highway-python`` names a Python with highway-env (``make bench-intersection`` makes
one). Targets: >= 100,000 agent-steps/s built in at 1024 envs, >= 2,000 env-steps/s for a
SUMO process.

``--validate``: fixed policies on random routes in both backends, low and high traffic,
``--episodes`` episodes each: completion and collision rates with 95% intervals (normal
approximation over the agents' outcomes). The validating policy is `IntersectionHeuristic`
(keep lane, slow down for vehicles in the cone ahead): the backends agree when its rates
differ by at most ``TOLERANCE`` under both traffic settings. Keeping the lane blindly is
reported beside it as a diagnostic: it measures how the two traffic models treat an agent
that never yields.

Usage: ``python benchmarks/intersection.py [--speed] [--validate] [--repeats 3]
[--seconds 3] [--episodes 800] [--highway-python PY] [--json F]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from shoal.config import EnvConfig
from shoal.envs.heuristics import IntersectionHeuristic
from shoal.envs.intersection.env import make_intersection
from shoal.threads import set_compute_threads

TARGET = 100_000
"""Agent-steps/s of the built-in intersection at 1024 envs."""
SUMO_TARGET = 2_000
"""Env-steps/s of one SUMO process."""
TOLERANCE = 0.05
"""Largest gap between the backends' completion (or collision) rates under one policy."""


def make(backend: str, num_envs: int, seed: int = 0, **kwargs):
    kwargs = {"backend": backend, "seed": seed, **kwargs}
    return make_intersection(
        EnvConfig(id="shoal/intersection-v0", num_envs=num_envs, kwargs=kwargs)
    )


def rate(backend: str, num_envs: int, seconds: float, seed: int = 0) -> float:
    """Env-steps/s of one timed block."""
    env = make(backend, num_envs, seed, traffic="high")
    env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    actions = [{"agent": rng.integers(4, size=(num_envs, 4))} for _ in range(64)]
    for a in actions[:20]:
        env.step(a)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        env.step(actions[steps % 64])
        steps += 1
    result = steps * num_envs / (time.perf_counter() - start)
    env.close()
    return result


def speed(args) -> dict:
    rows = {}
    cases = [("builtin", 1), ("builtin", 64), ("builtin", 1024), ("sumo", 1), ("sumo", 4)]
    for backend, n in cases:
        rates = [rate(backend, n, args.seconds, seed) for seed in range(args.repeats)]
        rows[f"{backend}/{n}"] = r = statistics.median(rates)
        where = " (worker processes)" if backend == "sumo" and n > 1 else ""
        print(f"{backend:>8}, {n:>4} envs{where}: {r:>9,.0f} env-steps/s, {4 * r:>9,.0f} "
              f"agent-steps/s (median of {args.repeats})", flush=True)  # fmt: skip
    if args.highway_python:
        out = subprocess.run(
            [args.highway_python, str(Path(__file__).with_name("highway_side.py")),
             "--seconds", str(args.seconds), "--repeats", str(args.repeats)],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        r = statistics.median(json.loads(out.stdout.strip().splitlines()[-1])["env_steps_per_s"])
        rows["highway-env/1"] = r
        print(f"highway-env intersection-multi-agent-v1, 1 env: {r:,.1f} env-steps/s, "
              f"{4 * r:,.1f} agent-steps/s")  # fmt: skip
    met = 4 * rows["builtin/1024"] >= TARGET
    sumo_met = rows["sumo/1"] >= SUMO_TARGET
    print(f"target >= {TARGET:,} agent-steps/s at 1024 envs: {'met' if met else 'MISSED'}")
    print(f"target >= {SUMO_TARGET:,} env-steps/s for a SUMO process: "
          f"{'met' if sumo_met else 'MISSED'}")  # fmt: skip
    return {"rows": rows, "met": met and sumo_met}


def outcome_rates(backend: str, policy: str, traffic: str, episodes: int, num_envs: int) -> dict:
    """Completion and collision rates (and the mean time to complete) of ``policy`` over at
    least ``episodes`` episodes of random routes."""
    env = make(backend, num_envs, seed=0, traffic=traffic)
    group = env.groups["agent"]
    heuristic = IntersectionHeuristic(group.observation_space, group.action_space)
    obs, _ = env.reset(seed=0)
    ended: list[dict] = []
    while sum(len(e["completion_rate"]) for e in ended) < episodes:
        if policy == "heuristic":
            actions = heuristic.act(obs["agent"])
        else:
            actions = np.zeros((num_envs, 4), np.int64)
        step = env.step({"agent": actions})
        obs = step.obs
        if step.episode_info is not None:
            ended.append(step.episode_info)
    env.close()
    info = {k: np.concatenate([e[k] for e in ended]) for k in ended[0]}
    n = 4 * len(info["completion_rate"])  # agents' outcomes

    def interval(p: float) -> float:
        return float(1.96 * np.sqrt(p * (1 - p) / n))

    c, x = float(info["completion_rate"].mean()), float(info["collision_rate"].mean())
    return {"episodes": n // 4, "completion": c, "completion_ci": interval(c),
            "collision": x, "collision_ci": interval(x),
            "time_to_complete": float(np.nanmean(info["time_to_complete"]))}  # fmt: skip


def validate(args) -> dict:
    rows, agree = [], True
    for policy in ("keep_lane", "heuristic"):
        for traffic in ("low", "high"):
            got = {b: outcome_rates(b, policy, traffic, args.episodes, n)
                   for b, n in (("builtin", 256), ("sumo", 8))}  # fmt: skip
            gap = max(abs(got["builtin"][k] - got["sumo"][k]) for k in ("completion", "collision"))
            if policy == "heuristic":
                agree &= gap <= TOLERANCE
            rows.append({"policy": policy, "traffic": traffic, **got, "gap": gap})
            for b, r in got.items():
                print(f"{policy:>9} {traffic:>4} {b:>7}: completion {r['completion']:.3f} "
                      f"+- {r['completion_ci']:.3f}, collision {r['collision']:.3f} +- "
                      f"{r['collision_ci']:.3f}, time to complete {r['time_to_complete']:.2f} s "
                      f"({r['episodes']} episodes)", flush=True)  # fmt: skip
            judged = f"tolerance {TOLERANCE}" if policy == "heuristic" else "diagnostic"
            print(f"{policy:>9} {traffic:>4} gap {gap:.3f} ({judged})")
    print(f"backends agree within {TOLERANCE} under the heuristic: {'yes' if agree else 'NO'}")
    return {"rows": rows, "met": agree}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--speed", action="store_true", help="simulation speed")
    parser.add_argument("--validate", action="store_true", help="built-in against SUMO")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0, help="length of a timed block")
    parser.add_argument("--episodes", type=int, default=800)
    parser.add_argument("--highway-python", help="a Python with highway-env installed")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if not (args.speed or args.validate):
        args.speed = True
    set_compute_threads(1)
    results = {}
    if args.speed:
        results["speed"] = speed(args)
    if args.validate:
        results["validate"] = validate(args)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0 if all(r["met"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
