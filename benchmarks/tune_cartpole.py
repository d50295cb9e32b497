"""``shoal tune`` against rl-baselines3-zoo's ``--optimize`` on PPO CartPole-v1.

Both tools run the same search: the same number of trials (20), the same budget per trial
(50k env steps, no early stop), Optuna's TPE sampler with median pruning, 5 evaluations per
trial of 5 deterministic episodes each, one worker, one torch thread, each in its own
process from the command line. Each tool searches its own PPO space over the same
hyperparameters (rollout length, minibatch, gamma, GAE lambda, learning rate, entropy
coefficient, clip range, epochs, gradient-norm clip, network size and activation): the zoo's
built-in ``sample_ppo_params`` on its CartPole setting (8 envs), shoal's ``SEARCH`` below on
the ``ppo-cartpole`` tuned example (128 envs). Each tool keeps its own sampler and pruner
settings (the zoo: multivariate TPE, 10 start-up trials, pruning after the first third;
shoal: TPE, median pruning after 3 trials).

Reported per search, from its Optuna study: the whole command's wall-clock, the time to the
best trial (from the study's first trial start to the end of the first trial that reached
the best value), the best value (the final 5-episode evaluation of that trial: the search's
own figure, biased upward as the best of 20), the median value of the completed trials, and
the trials completed, pruned and failed. Medians over ``--seeds`` searches (seeds 0, 1, ...;
the zoo does not seed its trials, only its sampler).

The zoo runs in its own virtual environment (``make bench-tune`` creates ``.venv-zoo``
with rl-zoo3 2.9.2 and the same Gymnasium and torch).

Usage: ``python benchmarks/tune_cartpole.py [--seeds 1] [--trials 20] [--steps 50000]
[--zoo-python .venv-zoo/bin/python] [--json F]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent

# shoal's PPO search space over the zoo's hyperparameters (rl_zoo3 hyperparams_opt.py
# sample_ppo_params): num_steps is per env over shoal's 128 envs (1k-16k steps a rollout;
# the zoo's 32-4096 over 8 envs is 256-32k), gamma and lambda on the zoo's ranges.
SEARCH = {
    "num_steps": "choice(8, 16, 32, 64, 128)",
    "minibatch_size": "choice(256, 512, 1024, 2048, 4096)",
    "gamma": "uniform(0.97, 0.9999)",
    "gae_lambda": "uniform(0.9, 0.9999)",
    "optim.lr": "loguniform(1e-5, 1e-2)",
    "ent_coef": "loguniform(1e-8, 0.1)",
    "clip_eps": "choice(0.1, 0.2, 0.3, 0.4)",
    "num_epochs": "choice(1, 5, 10, 20)",
    "optim.max_grad_norm": "uniform(0.3, 2.0)",
    "model.hidden": "choice([64], [64, 64], [256, 256])",
    "model.activation": "choice('tanh', 'relu')",
}

# Read in the tool's own environment (each has its own Optuna).
READ_STUDY = """
import json, sys, optuna
study = optuna.load_study(study_name=sys.argv[2], storage=sys.argv[1])
rows = [{"state": t.state.name, "value": t.value,
         "start": t.datetime_start.timestamp() if t.datetime_start else None,
         "end": t.datetime_complete.timestamp() if t.datetime_complete else None}
        for t in study.trials]
print(json.dumps(rows))
"""


def summarize(rows: list[dict], wall: float) -> dict:
    complete = [r for r in rows if r["state"] == "COMPLETE"]
    best = max(r["value"] for r in complete)
    first = min(r["start"] for r in rows if r["start"] is not None)
    reached = min(r["end"] for r in complete if r["value"] >= best)
    return {
        "wall_s": wall, "time_to_best_s": reached - first, "best": best,
        "median_value": statistics.median(r["value"] for r in complete),
        "complete": len(complete), "pruned": sum(r["state"] == "PRUNED" for r in rows),
        "failed": sum(r["state"] == "FAIL" for r in rows),
    }  # fmt: skip


def study_rows(python: str, storage: str, name: str) -> list[dict]:
    out = subprocess.run([python, "-c", READ_STUDY, storage, name], capture_output=True,
                         text=True, check=True)  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_shoal(root: Path, seed: int, trials: int, steps: int) -> dict:
    spec = {
        "name": f"shoal-s{seed}", "base": "ppo-cartpole", "seed": seed, "trials": trials,
        "sampler": "tpe", "pruner": "median", "search": SEARCH,
        "config": {"run": {"total_steps": steps, "target_return": None, "torch_threads": 1,
                           "eval_every_steps": steps // 5, "eval_episodes": 5,
                           "checkpoint_every_steps": 0}},
    }  # fmt: skip
    file = root / f"shoal-s{seed}.yaml"
    file.write_text(yaml.safe_dump(spec, sort_keys=False))
    directory = root / f"shoal-s{seed}"
    command = [sys.executable, "-m", "shoal.cli", "tune", str(file), "--dir", str(directory)]
    start = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, env=threads_env())
    wall = time.perf_counter() - start
    rows = study_rows(sys.executable, f"sqlite:///{directory / 'study.db'}", spec["name"])
    return summarize(rows, wall)


def run_zoo(root: Path, python: str, seed: int, trials: int, steps: int) -> dict:
    storage = f"sqlite:///{root / f'zoo-s{seed}.db'}"
    command = [python, "-m", "rl_zoo3.train", "--algo", "ppo", "--env", "CartPole-v1",
               "--optimize", "--n-trials", str(trials), "--n-timesteps", str(steps),
               "--sampler", "tpe", "--pruner", "median", "--n-jobs", "1",
               "--n-evaluations", "5", "--eval-episodes", "5", "--seed", str(seed),
               "--storage", storage, "--study-name", f"zoo-s{seed}",
               "--log-folder", str(root / f"zoo-logs-s{seed}"), "--verbose", "0",
               "--device", "cpu"]  # fmt: skip
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=threads_env(), cwd=root)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"rl-zoo3 failed ({done.returncode}): {done.stderr[-3000:]}")
    return summarize(study_rows(python, storage, f"zoo-s{seed}"), wall)


def threads_env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--steps", type=int, default=50_000, help="env steps per trial")
    parser.add_argument("--zoo-python", default=str(HERE.parent / ".venv-zoo/bin/python"))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="tune-cartpole-"))
    results: dict[str, list[dict]] = {"shoal": [], "rl-zoo3": []}
    for seed in range(args.seeds):  # interleaved, so that both see the same machine load
        results["shoal"].append(run_shoal(root, seed, args.trials, args.steps))
        print("shoal", seed, results["shoal"][-1], flush=True)
        results["rl-zoo3"].append(run_zoo(root, args.zoo_python, seed, args.trials, args.steps))
        print("rl-zoo3", seed, results["rl-zoo3"][-1], flush=True)
    keys = ("wall_s", "time_to_best_s", "best", "median_value", "complete", "pruned", "failed")
    print(f"\n{args.trials} trials of {args.steps} env steps, medians of {args.seeds} searches")
    print("| tool | " + " | ".join(keys) + " |\n" + "|---" * (len(keys) + 1) + "|")
    summary = {}
    for tool, runs in results.items():
        summary[tool] = {k: statistics.median(r[k] for r in runs) for k in keys}
        print(f"| {tool} | " + " | ".join(f"{summary[tool][k]:.1f}" for k in keys) + " |")
    ratio = summary["rl-zoo3"]["time_to_best_s"] / summary["shoal"]["time_to_best_s"]
    print(f"time to best, rl-zoo3 / shoal: {ratio:.1f}x")
    if args.json:
        args.json.write_text(json.dumps({"settings": vars(args) | {"json": str(args.json)},
                                         "search": SEARCH, "runs": results, "summary": summary},
                                        indent=2))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
