"""Defaults that learn: each algorithm's own defaults (no tuned example) on the easy tasks of
its kind, at a modest budget, against the bar its family's peer libraries reach with theirs.

A row trains ``shoal.train(ALGO, env=TASK, total_steps=BUDGET, seed=S)``: only the task,
the budget, the seed and quiet logging are set; the evaluation is the run's own final one
(deterministic, ``run.eval_episodes`` episodes), plus the best evaluation on the way. Results
are appended to ``--json`` as each run ends and runs already there are skipped, so a killed
sweep resumes. ``--only`` restricts the sweep to algorithms or tasks by name, ``--tasks``
to tasks.

The bars (``TASKS``) are what the peers' defaults reach at about these budgets: Stable-
Baselines3's PPO, A2C, DQN and SAC defaults solve CartPole and Acrobot in 100k-200k steps and
swing Pendulum up within 20k (off-policy) to 200k (on-policy) steps (rl-baselines3-zoo's
benchmark tables, 2024). A default that misses its bar where the peers' meet theirs is
changed, and the change is in docs/changelog.md.

Usage: ``python benchmarks/defaults.py [--seeds 1] [--only ppo,dqn] [--json
benchmarks/results/defaults.json]``; ``--sb3`` runs Stable-Baselines3's defaults on the same
tasks and budgets (pip install -e '.[bench]'). See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from spreads import cpu_name  # benchmarks/spreads.py: the script's directory is on sys.path

import shoal


@dataclass(frozen=True)
class Task:
    env: str
    on_policy_budget: int
    off_policy_budget: int
    random: float
    """A uniformly random policy's score (mean return; 0 for a normalized score)."""
    bar: float
    """The score a default that learns reaches within the budget."""
    metric: str = "eval/return"
    """What is scored: the evaluation's return, an offline learner's normalized score, a
    game-player's score against a minimax player."""
    settings: tuple[tuple[str, object], ...] = ()
    """What the task sets beyond the env (an offline learner's dataset)."""


TASKS = {
    "CartPole-v1": Task("CartPole-v1", 200_000, 100_000, 22.0, 475.0),
    "Acrobot-v1": Task("Acrobot-v1", 200_000, 100_000, -499.0, -100.0),
    "Pendulum-v1": Task("Pendulum-v1", 300_000, 20_000, -1_230.0, -250.0),
    "InvertedPendulum-v5": Task("InvertedPendulum-v5", 200_000, 30_000, 5.6, 900.0),
    # Short: the off-policy learners' 20k steps are a few minutes on one core; random play
    # scores about -280 over 1,000 steps, and 500 is running forward.
    "HalfCheetah-v5": Task("HalfCheetah-v5", 200_000, 20_000, -280.0, 500.0),
    # A team: the mean of each agent's return over an episode; random play about -25 (the
    # learning tests' measure), and a default that learns gains 5 over it as MAPPO's test asks.
    # The off-policy budget is QMIX's tuned one: its epsilon anneals over 50k env steps
    # (PyMARL's and EPyMARL's epsilon_anneal_time), so a shorter run is scored exploring.
    "shoal/spread-v0": Task("shoal/spread-v0", 400_000, 120_000, -25.2, -20.2),
    "shoal/two-step-v0": Task("shoal/two-step-v0", 20_000, 20_000, 4.0, 7.0),
    # A game: the score of the search (AlphaZero) or the policy against minimax play; a draw
    # against perfect play scores 0.5.
    "openspiel:tic_tac_toe": Task(
        "openspiel:tic_tac_toe", 20_480, 20_480, 0.0, 0.5, "eval/vs_minimax/score"
    ),
    # The bundled recipe's dataset (shoal collect --recipe pendulum-medium: normalized about
    # 50); budgets in gradient updates. Beating random play by 30 is learning from it.
    "pendulum-medium": Task(
        "dataset",
        5_000,
        5_000,
        0.0,
        30.0,
        "eval/normalized_score",
        (("dataset", "datasets/pendulum-medium"),),
    ),
    "CliffWalking-v1": Task("CliffWalking-v1", 50_000, 50_000, -1_000.0, -17.0),
}
DISCRETE = ("CartPole-v1", "Acrobot-v1")
CONTINUOUS = ("Pendulum-v1", "InvertedPendulum-v5", "HalfCheetah-v5")
ALGOS: dict[str, tuple[tuple[str, ...], bool]] = {
    # name: (tasks, off-policy budget)
    "ppo": (DISCRETE + CONTINUOUS, False),
    "a2c": (DISCRETE + CONTINUOUS, False),
    "pg": (DISCRETE, False),
    "trpo": (DISCRETE + CONTINUOUS, False),
    "acktr": (DISCRETE, False),
    "acer": (DISCRETE, False),
    "impala": (DISCRETE, False),
    "appo": (DISCRETE, False),
    "dqn": (DISCRETE, True),
    "qrdqn": (DISCRETE, True),
    "rem": (DISCRETE, True),
    "sac": (CONTINUOUS, True),
    "td3": (CONTINUOUS, True),
    "ddpg": (CONTINUOUS, True),
    "d4pg": (CONTINUOUS, True),
    "mappo": (("shoal/spread-v0",), False),
    "ippo": (("shoal/spread-v0",), False),
    "maddpg": (("shoal/spread-v0",), True),
    "qmix": (("shoal/spread-v0", "shoal/two-step-v0"), True),
    "vdn": (("shoal/two-step-v0",), True),
    "alphazero": (("openspiel:tic_tac_toe",), False),
    "bc": (("pendulum-medium",), True),
    "cql": (("pendulum-medium",), True),
    "iql-offline": (("pendulum-medium",), True),
    "td3-bc": (("pendulum-medium",), True),
    "es": (("CartPole-v1",), False),
    "ars": (("CartPole-v1",), False),
    "ga": (("CartPole-v1",), False),
    "cmaes": (("CartPole-v1",), False),
    **{
        name: (("CliffWalking-v1",), True)
        for name in ("q-learning", "sarsa", "expected-sarsa", "sarsa-lambda", "q-lambda")
    },
}
EVOLUTION_BUDGET = 2_000_000
"""The derivative-free learners' budget on CartPole (a generation plays 1,000 episodes)."""


class Scores:
    """A training callback recording ``metric`` at every evaluation: the loop's (the final
    one included) and an algorithm's own (AlphaZero's matches, logged with its iteration)."""

    def __init__(self, metric: str):
        self.metric, self.seen = metric, []

    def on_iteration(self, metrics: dict) -> None:
        if self.metric in metrics and "eval/return" not in metrics:  # the algorithm's own
            self.seen.append(float(metrics[self.metric]))

    def on_evaluation(self, result: dict) -> None:
        if self.metric in result:
            self.seen.append(float(result[self.metric]))


def run_one(algo: str, task: Task, off_policy: bool, seed: int) -> dict:
    budget = task.off_policy_budget if off_policy else task.on_policy_budget
    if algo in ("es", "ars", "ga", "cmaes"):
        budget = EVOLUTION_BUDGET
    env = {} if task.env == "dataset" else {"env": task.env}
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        scores = Scores(task.metric)
        result = shoal.train(
            algo, **env, total_steps=budget, seed=seed, run_dir=f"{tmp}/run", quiet=True,
            **{"run.tensorboard": False, "run.checkpoint_every_steps": 0}, **dict(task.settings),
            callbacks=[scores],
        )  # fmt: skip
        evals = scores.seen
        wall = time.perf_counter() - started
    final = evals[-1] if evals else None
    return {
        "algo": algo, "env": task.env if task.env != "dataset" else dict(task.settings)["dataset"],
        "seed": seed, "budget": budget, "metric": task.metric,
        "final": final, "best": max(evals, default=final), "random": task.random,
        "bar": task.bar, "learns": final is not None and final >= task.bar,
        "train_s": round(result.train_s, 1), "wall_s": round(wall, 1), "cpu": cpu_name(),
    }  # fmt: skip


SB3 = {"ppo": "PPO", "a2c": "A2C", "dqn": "DQN", "sac": "SAC", "td3": "TD3", "ddpg": "DDPG",
       "trpo": "TRPO", "qrdqn": "QRDQN"}  # fmt: skip
"""The algorithms Stable-Baselines3 (and sb3-contrib: TRPO, QR-DQN) has, by class name."""


def run_sb3(algo: str, task: Task, off_policy: bool, seed: int) -> dict:
    """Stable-Baselines3's defaults (``Class("MlpPolicy", env)``, one env, as its docs start)
    on the same task and budget, evaluated deterministically over 10 episodes."""
    import gymnasium as gym
    import stable_baselines3
    from stable_baselines3.common.evaluation import evaluate_policy

    from shoal.core.threads import set_compute_threads

    set_compute_threads(1)
    budget = task.off_policy_budget if off_policy else task.on_policy_budget
    started = time.perf_counter()
    import sb3_contrib

    library = sb3_contrib if hasattr(sb3_contrib, SB3[algo]) else stable_baselines3
    model = getattr(library, SB3[algo])("MlpPolicy", task.env, seed=seed, verbose=0)
    model.learn(total_timesteps=budget)
    train_s = time.perf_counter() - started
    env = gym.make(task.env)
    env.reset(seed=10_000 + seed)
    final, _ = evaluate_policy(model, env, n_eval_episodes=10, deterministic=True)
    env.close()
    return {
        "library": "sb3", "algo": algo, "env": task.env, "seed": seed, "budget": budget,
        "final": float(final), "best": float(final), "random": task.random, "bar": task.bar,
        "learns": float(final) >= task.bar, "train_s": round(train_s, 1),
        "wall_s": round(train_s, 1), "cpu": cpu_name(),
    }  # fmt: skip


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}" if abs(value) < 10 else f"{value:.1f}"


def table(rows: list[dict]) -> str:
    lines = ["| library | algorithm | task | budget | final eval | best eval | random | bar "
             "| learns | training s |", "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        lines.append(
            f"| {r.get('library', 'shoal')} | {r['algo']} | {r['env']} | {r['budget']:,} | "
            f"{_num(r['final'])} | "
            f"{_num(r['best'])} | {r['random']:g} | {r['bar']:g} | "
            f"{'yes' if r['learns'] else 'no'} | {r['train_s']:.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--only", default="", help="comma-separated algorithms or tasks")
    parser.add_argument("--tasks", default="", help="comma-separated tasks: only these")
    parser.add_argument("--json", type=Path, default=Path("benchmarks/results/defaults.json"))
    parser.add_argument(
        "--sb3",
        action="store_true",
        help="Stable-Baselines3's defaults instead, for the algorithms it has",
    )
    args = parser.parse_args()
    only = {x for x in args.only.split(",") if x}
    tasks_only = {x for x in args.tasks.split(",") if x}
    library = "sb3" if args.sb3 else "shoal"
    rows: list[dict] = json.loads(args.json.read_text()) if args.json.exists() else []
    for algo, (tasks, off_policy) in ALGOS.items():
        if args.sb3 and algo not in SB3:
            continue
        for env in tasks:
            if only and algo not in only and env not in only:
                continue
            if tasks_only and env not in tasks_only:
                continue
            for seed in range(args.seeds):
                key = (library, algo, env, seed)
                if any((r.get("library", "shoal"), r["algo"], r["env"], r["seed"]) == key
                       for r in rows):  # fmt: skip
                    continue
                run = run_sb3 if args.sb3 else run_one
                row = run(algo, TASKS[env], off_policy, seed)
                print(json.dumps(row), flush=True)
                rows.append(row)
                args.json.parent.mkdir(parents=True, exist_ok=True)
                args.json.write_text(json.dumps(rows, indent=1) + "\n")
    print(table(rows))


if __name__ == "__main__":
    main()
