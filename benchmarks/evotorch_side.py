"""EvoTorch's side of benchmarks/evolution.py, run in its own virtual environment
(``make .venv-evotorch/.installed``): PGPE set up as Salimans et al.'s evolution strategies
(a fixed standard deviation, Adam on the center, centered ranks, mirrored sampling) on a
Gymnasium task with EvoTorch's `GymNE` problem, in this process (no Ray actors), as shoal's
in-process evaluator runs. Prints one JSON line.

Usage: ``python evotorch_side.py --env Swimmer-v5 --seed 0 --popsize 64 --generations 30
--stdev 0.05 --lr 0.05 --hidden 0`` (hidden 0: a linear policy, otherwise one tanh layer of
that width).
"""

from __future__ import annotations

import argparse
import json
import time

import gymnasium as gym
import numpy as np
import torch
from evotorch.algorithms import PGPE
from evotorch.neuroevolution import GymNE


def evaluate(policy: torch.nn.Module, env_id: str, episodes: int, seed: int) -> float:
    """Mean return of ``policy`` over ``episodes`` episodes seeded ``seed``, ``seed + 1``, ..."""
    env, returns = gym.make(env_id), []
    for e in range(episodes):
        obs, _ = env.reset(seed=seed + e)
        total, done = 0.0, False
        while not done:
            with torch.no_grad():
                action = policy(torch.as_tensor(obs, dtype=torch.float32)).numpy()
            obs, reward, terminated, truncated, _ = env.step(action)
            total, done = total + float(reward), terminated or truncated
        returns.append(total)
    env.close()
    return float(np.mean(returns))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--env", default="Swimmer-v5")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--popsize", type=int, default=64)
    parser.add_argument("--generations", type=int, default=30)
    parser.add_argument("--stdev", type=float, default=0.05)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--hidden", type=int, default=0)
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument("--eval-seed", type=int, default=10_000)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    if args.hidden:
        width = args.hidden
        network = f"Linear(obs_length, {width}) >> Tanh() >> Linear({width}, act_length)"
    else:
        network = "Linear(obs_length, act_length)"
    started = time.perf_counter()
    problem = GymNE(env=args.env, network=network, observation_normalization=True,
                    num_episodes=1, initial_bounds=(-1e-5, 1e-5))  # fmt: skip
    searcher = PGPE(problem, popsize=args.popsize, center_learning_rate=args.lr,
                    stdev_learning_rate=0.0, stdev_init=args.stdev, optimizer="adam",
                    ranking_method="centered", symmetric=True)  # fmt: skip
    setup_s = time.perf_counter() - started
    curve, train_s = [], 0.0
    for _ in range(args.generations):
        tick = time.perf_counter()
        searcher.step()
        train_s += time.perf_counter() - tick
        curve.append(float(searcher.status["mean_eval"]))
    policy = problem.to_policy(searcher.status["center"])
    final = evaluate(policy, args.env, args.eval_episodes, args.eval_seed)
    episodes = args.popsize * args.generations
    print(json.dumps({
        "library": "evotorch", "seed": args.seed, "episodes": episodes,
        "env_steps": int(problem.status.get("total_interaction_count", 0)),
        "setup_s": setup_s, "train_s": train_s, "episodes_per_s": episodes / train_s,
        "population_mean_curve": curve, "final_return": final,
        "parameters": int(problem.solution_length),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
