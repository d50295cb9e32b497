"""The settings every library of ``benchmarks/peers.py`` trains with, and what its side
scripts share: the evaluation of a CartPole policy, the clock, the JSON line they print.

Imported by the side scripts in the peers' own virtual environments, so it needs only
NumPy, Gymnasium and torch (never shoal).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

ROWS: dict[str, dict[str, Any]] = {
    # rl-baselines3-zoo's PPO on CartPole-v1 (hyperparams/ppo.yml), with its linear lr and
    # clip schedules left constant (not every library has them): separate 64-64 tanh actor
    # and critic, Adam eps 1e-5, advantages normalized per minibatch, value loss 0.5 x MSE.
    "ppo-cartpole": {
        "env": "CartPole-v1", "num_envs": 8, "num_steps": 32, "num_epochs": 20,
        "minibatch_size": 256, "hidden": [64, 64], "activation": "tanh", "lr": 1e-3,
        "clip_eps": 0.2, "gamma": 0.98, "gae_lambda": 0.8, "ent_coef": 0.0, "vf_coef": 0.5,
        "max_grad_norm": 0.5, "throughput_steps": 32_768, "solve_budget": 100_000,
        "eval_every": 8_192, "solve_return": 475.0,
    },
    # The Atari PPO of rl-baselines3-zoo and CleanRL (constant lr and clip, as above): 8
    # envs x 128 steps, 4 epochs of 256-frame minibatches, the Nature CNN shared by policy and
    # value, float32; each library's own DeepMind-style Pong pipeline. Frames = steps x 4.
    "ppo-pong": {
        "env": "PongNoFrameskip-v4", "num_envs": 8, "num_steps": 128, "num_epochs": 4,
        "minibatch_size": 256, "lr": 2.5e-4, "clip_eps": 0.1, "gamma": 0.99,
        "gae_lambda": 0.95, "ent_coef": 0.01, "vf_coef": 0.5, "max_grad_norm": 0.5,
        "throughput_steps": 8_192, "warmup_steps": 1_024,
    },
    # SAC on HalfCheetah-v5 as in Haarnoja et al. and every library's example: 256-256 ReLU
    # actor and twin critics, batch 256, Adam 3e-4, gamma 0.99, tau 0.005, automatic entropy
    # temperature, one gradient step per env step; updates/s after learning_starts.
    "sac-halfcheetah": {
        "env": "HalfCheetah-v5", "hidden": [256, 256], "batch_size": 256, "lr": 3e-4,
        "gamma": 0.99, "tau": 0.005, "buffer_size": 1_000_000, "learning_starts": 1_000,
        "timed_updates": 2_000,
    },
    # rl-baselines3-zoo's DQN on CartPole-v1 (hyperparams/dqn.yml): 256-256 ReLU, Adam
    # 2.3e-3, batch 64, replay 100k, learning_starts 1000, 128 gradient steps every 256 env
    # steps, epsilon 1 -> 0.04 over 16% of 50k steps, Huber loss, no double Q. The zoo's
    # target copy every 10 env steps happens while collecting, so the target is the online
    # network of each 128-step training phase's start: every 128 gradient steps in the
    # libraries that count target updates in gradient steps.
    "dqn-cartpole": {
        "env": "CartPole-v1", "hidden": [256, 256], "lr": 2.3e-3, "batch_size": 64,
        "buffer_size": 100_000, "learning_starts": 1_000, "gamma": 0.99,
        "target_update_gradient_steps": 128, "train_freq": 256, "gradient_steps": 128,
        "exploration_fraction": 0.16, "exploration_final_eps": 0.04, "max_grad_norm": 10.0,
        "throughput_steps": 50_000, "solve_budget": 50_000, "eval_every": 2_560,
        "solve_return": 475.0,
    },
}  # fmt: skip

EVAL_EPISODES = 20
EVAL_SEED = 10_000


def one_thread() -> None:
    """One compute thread for every library (torch's intra-op pool)."""
    import torch

    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def evaluate_cartpole(act: Callable[[np.ndarray], np.ndarray]) -> float:
    """Mean return of ``EVAL_EPISODES`` deterministic CartPole-v1 episodes, one per env of a
    vector env with fixed seeds; ``act(obs [N, 4]) -> actions [N]``."""
    env = gym.make_vec("CartPole-v1", num_envs=EVAL_EPISODES, vectorization_mode="sync")
    obs, _ = env.reset(seed=EVAL_SEED)
    returns = np.zeros(EVAL_EPISODES)
    done = np.zeros(EVAL_EPISODES, dtype=bool)
    while not done.all():
        obs, reward, terminated, truncated, _ = env.step(np.asarray(act(obs)))
        returns += reward * ~done
        done |= terminated | truncated
    env.close()
    return float(returns.mean())


class Clock:
    """Training time with evaluations left out: ``pause`` around them."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.paused = 0.0

    def elapsed(self) -> float:
        return time.perf_counter() - self.start - self.paused

    def pause(self) -> _Paused:
        return _Paused(self)


class _Paused:
    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    def __enter__(self) -> None:
        self.began = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self.clock.paused += time.perf_counter() - self.began


class Solver:
    """Evaluates every ``eval_every`` env steps with the clock paused; ``solved`` holds the
    training seconds and env steps of the first evaluation at or above the target."""

    def __init__(self, row: dict[str, Any], act: Callable[[np.ndarray], np.ndarray]):
        self.row, self.act = row, act
        self.clock = Clock()
        self.next_eval = row["eval_every"]
        self.solved: tuple[float, int] | None = None

    def check(self, env_steps: int) -> bool:
        """Call after each iteration; True once solved."""
        if self.solved is None and env_steps >= self.next_eval:
            self.next_eval += self.row["eval_every"]
            seconds = self.clock.elapsed()
            with self.clock.pause():
                score = evaluate_cartpole(self.act)
            if score >= self.row["solve_return"]:
                self.solved = (seconds, env_steps)
        return self.solved is not None

    def result(self, env_steps: int) -> dict[str, Any]:
        if self.solved is None:
            return {"solved": False, "solve_s": self.clock.elapsed(), "solve_steps": env_steps}
        return {"solved": True, "solve_s": self.solved[0], "solve_steps": self.solved[1]}


def report(result: dict[str, Any]) -> None:
    """The side script's answer: one JSON line, last on stdout."""
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()


def side_parser(doc: str):
    import argparse

    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--row", required=True, choices=sorted(ROWS))
    parser.add_argument("--mode", default="throughput", choices=["throughput", "solve"])
    parser.add_argument("--seed", type=int, default=0)
    return parser


def side_main(
    doc: str,
    run_ppo: Callable,
    run_sac: Callable,
    run_dqn: Callable,
    version: Callable[[], str],
    parser: Any = None,
) -> None:
    """A side script's command line: the row's run with one compute thread, reported with
    the library's version. ``run_ppo(row, seed, mode, pixels, **options)``,
    ``run_sac(row, seed)``, ``run_dqn(row, seed, mode)``; ``options`` are the script's own
    arguments beyond ``side_parser``'s (``parser``, extended)."""
    args = (parser or side_parser(doc)).parse_args()
    options = {k: v for k, v in vars(args).items() if k not in ("row", "mode", "seed")}
    one_thread()
    row = ROWS[args.row]
    if args.row in ("ppo-cartpole", "ppo-pong"):
        result = run_ppo(row, args.seed, args.mode, pixels=args.row == "ppo-pong", **options)
    elif args.row == "sac-halfcheetah":
        result = run_sac(row, args.seed)
    else:
        result = run_dqn(row, args.seed, args.mode)
    report({**result, "version": version()})
