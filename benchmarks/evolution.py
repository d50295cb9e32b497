"""The derivative-free learners: shoal against EvoTorch, the batched population against a loop
over individuals, and scaling over Ray workers.

* ``peers``: evolution strategies on Swimmer-v5 in shoal (``es``) and in EvoTorch (PGPE with a
  fixed standard deviation, Adam on the center, centered ranks and mirrored sampling: the
  same algorithm; EvoTorch has no ARS), plus shoal's ARS at the same population: a linear
  policy, 64 episodes per generation (32 mirrored pairs), noise 0.05, Adam step 0.05, the
  observation filter on, the same number of generations; both in one process, one torch
  thread. Reports episodes/s while searching and the final center's mean return over 10
  episodes with fixed seeds (the same evaluation loop for both libraries), per seed.
* ``batched``: shoal's evaluator playing a population of 64 with one batched forward per step
  against the same evaluator with a loop of one forward per individual per step.
* ``scaling``: shoal ES with 1 and 2 Ray workers: episodes/s and the bytes sent to each worker
  per generation, from which the note projects 64 and 1,024 workers.

Usage: ``python benchmarks/evolution.py [--seeds 3] [--parts peers batched scaling]
[--evotorch-python .venv-evotorch/bin/python] [--json out.json] [--quick]``
(``make bench-evolution`` makes EvoTorch's environment). See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from common import environment

import shoal
import shoal.collect.population as population_module
from shoal.collect.population import Individual, PopulationEvaluator
from shoal.config import EnvConfig, ModelConfig
from shoal.data.noise import NoiseTable
from shoal.nn.population import LinearPolicy, PolicyNetwork, parameter_vector, set_parameter_vector
from shoal.registry import get_algorithm

HERE = Path(__file__).parent
ENV = "Swimmer-v5"
POPULATION, STDEV, STEP = 64, 0.05, 0.05
EVAL_EPISODES, EVAL_SEED = 10, 10_000
SHOAL_ES = {"episodes_per_batch": POPULATION, "train_batch_size": 1, "noise_stdev": STDEV,
            "stepsize": STEP, "l2_coeff": 0.0, "search.policy": "linear",
            "search.noise_size": 10_000_000, "search.eval_prob": 0.0}  # fmt: skip
SHOAL_ARS = {"num_rollouts": POPULATION // 2, "rollouts_used": POPULATION // 8,
             "noise_stdev": STDEV, "sgd_stepsize": 0.02, "search.policy": "linear",
             "search.noise_size": 10_000_000, "search.eval_prob": 0.0}  # fmt: skip


def evaluate_policy(policy: Any, episodes: int = EVAL_EPISODES, seed: int = EVAL_SEED) -> float:
    """Mean return of a shoal policy over episodes seeded like EvoTorch's side does."""
    env, returns = gym.make(ENV), []
    for e in range(episodes):
        obs, _ = env.reset(seed=seed + e)
        total, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(policy.act(obs))
            total, done = total + float(reward), terminated or truncated
        returns.append(total)
    env.close()
    return float(np.mean(returns))


def shoal_search(algo: str, seed: int, generations: int, overrides: dict[str, Any]) -> dict:
    torch.set_num_threads(1)
    started = time.perf_counter()
    spec = get_algorithm(algo)
    config = shoal.api.build_config(algo, env=ENV, seed=seed,
                                    **{"run.console": False, **overrides})  # fmt: skip
    learner = spec.algorithm_cls(config)
    setup_s = time.perf_counter() - started
    train_s, curve, episodes = 0.0, [], 0
    for _ in range(generations):
        tick = time.perf_counter()
        metrics = learner.train_iteration()
        train_s += time.perf_counter() - tick
        curve.append(metrics["episode/return"])
        episodes += metrics["episode/count"]  # the mirrored pairs, both members
    final = evaluate_policy(learner.policy())
    result = {"library": f"shoal {algo}", "seed": seed, "episodes": episodes,
              "env_steps": learner.env_steps, "setup_s": setup_s, "train_s": train_s,
              "episodes_per_s": episodes / train_s, "population_mean_curve": curve,
              "final_return": final, "parameters": learner.population.dim}  # fmt: skip
    learner.close()
    return result


def evotorch_search(python: str, seed: int, generations: int) -> dict:
    command = [python, str(HERE / "evotorch_side.py"), "--env", ENV, "--seed", str(seed),
               "--popsize", str(POPULATION), "--generations", str(generations),
               "--stdev", str(STDEV), "--lr", str(STEP), "--hidden", "0",
               "--eval-episodes", str(EVAL_EPISODES), "--eval-seed", str(EVAL_SEED)]  # fmt: skip
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def peers(seeds: int, generations: int, evotorch_python: str | None) -> dict:
    runs = []
    for seed in range(seeds):  # interleaved, so that machine noise hits all of them
        runs.append(shoal_search("es", seed, generations, SHOAL_ES))
        runs.append(shoal_search("ars", seed, generations, SHOAL_ARS))
        if evotorch_python:
            runs.append(evotorch_search(evotorch_python, seed, generations))
        for run in runs[-3:]:
            print(f"  {run['library']:>10} seed {seed}: {run['episodes_per_s']:7.1f} episodes/s, "
                  f"final return {run['final_return']:7.1f}", flush=True)  # fmt: skip
    summary = {}
    for library in sorted({r["library"] for r in runs}):
        mine = [r for r in runs if r["library"] == library]
        summary[library] = {
            "median_episodes_per_s": statistics.median(r["episodes_per_s"] for r in mine),
            "median_final_return": statistics.median(r["final_return"] for r in mine),
            "final_returns": [round(r["final_return"], 1) for r in mine],
        }
    if "evotorch" in summary:
        ours, theirs = summary["shoal es"], summary["evotorch"]
        summary["es_speedup_vs_evotorch"] = (
            ours["median_episodes_per_s"] / theirs["median_episodes_per_s"]
        )
    return {"runs": runs, "summary": summary}


def looped_actions(model: torch.nn.Module, vectors: torch.Tensor, obs: torch.Tensor):
    """One forward per individual: what an evaluator without the batched pass does."""
    out = []
    with torch.no_grad():
        for vector, own in zip(vectors, obs, strict=True):
            set_parameter_vector(model, vector)
            out.append(model(own))
    return torch.stack(out)


def batched(repeats: int) -> dict:
    torch.set_num_threads(1)
    table, rows = NoiseTable(0, 1_000_000), {}
    mlp = ModelConfig(hidden=(64, 64))
    cases = {"linear": lambda o, a: LinearPolicy(o, a),
             "mlp 64x64": lambda o, a: PolicyNetwork(o, a, mlp)}  # fmt: skip
    for env_id in ("Pendulum-v1", ENV):
        for name, model_fn in cases.items():
            evaluator = PopulationEvaluator(EnvConfig(id=env_id), model_fn, table)
            base = parameter_vector(evaluator.model).numpy()
            people = [Individual((o,), (STDEV,)) for o in range(0, 64 * 1000, 1000)]
            timings = {}
            for mode in ("batched", "loop", "batched", "loop")[: 2 * repeats]:
                population_module.population_actions = (
                    looped_actions if mode == "loop" else _batched_actions
                )
                tick = time.perf_counter()
                result = evaluator.evaluate(base, people, 1, env_seed=0)
                seconds = time.perf_counter() - tick
                timings.setdefault(mode, []).append(result.returns.size / seconds)
            population_module.population_actions = _batched_actions
            row = {mode: statistics.median(v) for mode, v in timings.items()}
            row["ratio"] = row["batched"] / row["loop"]
            rows[f"{env_id}, {name}"] = row
            print(f"  {env_id}, {name}: batched {row['batched']:.1f}, loop {row['loop']:.1f} "
                  f"episodes/s ({row['ratio']:.2f}x)", flush=True)  # fmt: skip
            evaluator.close()
    return rows


_batched_actions = population_module.population_actions


def scaling(generations: int) -> dict:
    rows = {}
    for runners in (1, 2):
        config = shoal.api.build_config("es", env=ENV, seed=0,
                                        **{"run.console": False, "run.runners": runners,
                                           **SHOAL_ES})  # fmt: skip
        learner = get_algorithm("es").algorithm_cls(config)
        rates, bytes_sent, update, communicate = [], [], [], []
        for generation in range(generations + 1):
            metrics = learner.train_iteration()
            if generation:  # the first generation starts the workers' envs
                rates.append(metrics["episode/count"] / metrics["perf/generation_s"])
                bytes_sent.append(metrics["perf/bytes_per_worker"])
                update.append(metrics["perf/update_s"])
                communicate.append(metrics["perf/communicate_s"])
        learner.close()
        rows[runners] = {"episodes_per_s": statistics.median(rates),
                         "bytes_per_worker": statistics.median(bytes_sent),
                         "update_s": statistics.median(update),
                         "communicate_s": statistics.median(communicate)}  # fmt: skip
        print(f"  {runners} worker(s): {rows[runners]['episodes_per_s']:.1f} episodes/s, "
              f"{rows[runners]['bytes_per_worker']:.0f} bytes per worker per generation",
              flush=True)  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--generations", type=int, default=30)
    parser.add_argument("--parts", nargs="+", default=["peers", "batched", "scaling"])
    parser.add_argument("--evotorch-python", default=str(HERE.parent / ".venv-evotorch/bin/python"))
    parser.add_argument("--json", default=None)
    parser.add_argument("--quick", action="store_true", help="1 seed, 3 generations")
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.generations = 1, 3
    evotorch_python = args.evotorch_python if Path(args.evotorch_python).exists() else None
    if evotorch_python is None:
        print(f"no EvoTorch at {args.evotorch_python} (make .venv-evotorch/.installed): "
              "shoal only", file=sys.stderr)  # fmt: skip
    report: dict[str, Any] = {"environment": environment(), "settings": {
        "env": ENV, "population": POPULATION, "stdev": STDEV, "step": STEP,
        "generations": args.generations, "seeds": args.seeds}}  # fmt: skip
    started = time.perf_counter()
    if "peers" in args.parts:
        print(f"(a) {ENV}, {args.generations} generations of {POPULATION} episodes", flush=True)
        report["peers"] = peers(args.seeds, args.generations, evotorch_python)
        print(json.dumps(report["peers"]["summary"], indent=1))
    if "batched" in args.parts:
        print("(b) a population of 64, one batched forward against a loop", flush=True)
        report["batched"] = batched(2)
    if "scaling" in args.parts:
        print(f"(c) shoal ES on {ENV} with 1 and 2 Ray workers", flush=True)
        report["scaling"] = scaling(max(3, args.generations // 3))
    print(f"benchmark took {time.perf_counter() - started:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
