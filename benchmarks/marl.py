"""MAPPO training throughput and score: shoal against BenchMARL (TorchRL) at equal settings.

Both train MAPPO (shared policy per group, a centralized critic on the global state) on
mpe2's PettingZoo ``simple_spread_v3`` (3 agents, 25-step episodes, discrete actions) with
the same settings: 10 envs stepped in one process, 2,000 env steps per batch (200 per env),
10 epochs of minibatches of 400 env steps (1,200 agent rows), 64-64 tanh networks for the
policy and the critic, Adam lr 5e-4 (eps 1e-5), gradient norm clipped at 0.5, gamma 0.99, GAE
lambda 0.95, clip 0.2, no entropy bonus, value-loss weight 0.5, advantages not standardized
(BenchMARL's MAPPO does not), one torch thread each. Runs alternate between the libraries,
seed by seed, so both see the same machine load.

Reported per library: training env-steps/s (collection and updates; evaluation, logging and
set-up excluded), medians over seeds, and the mean per-agent return of the final
deterministic policy over 32 episodes, its mean over seeds with a 95% Student-t confidence
interval. BenchMARL runs in its own virtual environment (``make bench-marl`` creates
``.venv-benchmarl``) through ``benchmarks/benchmarl_side.py``.

Usage: ``python benchmarks/marl.py --seeds 3 [--frames 100000] [--quick]``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import base_parser, environment, median
from rich.console import Console
from rich.table import Table

import shoal
from shoal.collect.evaluate import evaluate
from shoal.config import EnvConfig
from shoal.core.stats import t_interval
from shoal.core.threads import set_compute_threads

HERE = Path(__file__).resolve().parent
EVAL_EPISODES = 32
TASK = "simple_spread"
ENVS, FRAMES_PER_BATCH, EPOCHS, MINIBATCH_FRAMES, AGENTS = 10, 2000, 10, 400, 3


def shoal_side(seed: int, frames: int, workdir: Path) -> dict[str, Any]:
    set_compute_threads(1)
    env_id = f"pettingzoo:mpe2.{TASK}_v3"
    result = shoal.train(
        "mappo",
        seed=seed,
        total_steps=frames,
        run_dir=str(workdir / f"shoal-{seed}"),
        **{"env.id": env_id, "env.num_envs": ENVS, "env.kwargs": {"max_cycles": 25},
           "num_steps": FRAMES_PER_BATCH // ENVS, "num_epochs": EPOCHS,
           "minibatch_size": MINIBATCH_FRAMES * AGENTS, "model.hidden": (64, 64),
           "model.activation": "tanh", "optim.lr": 5e-4, "optim.eps": 1e-5,
           "optim.max_grad_norm": 0.5, "gamma": 0.99, "gae_lambda": 0.95, "clip_eps": 0.2,
           "ent_coef": 0.0, "vf_coef": 0.5, "normalize_advantages": False,
           "run.eval_every_steps": 0, "run.checkpoint_every_steps": 0,
           "run.console": False, "run.tensorboard": False, "run.torch_threads": 1},
    )  # fmt: skip
    env = shoal.make_env(
        EnvConfig(
            id=env_id,
            num_envs=EVAL_EPISODES,
            kwargs={"max_cycles": 25},
            agent_id=True,
            global_state=True,
        )  # fmt: skip
    )
    score = evaluate(shoal.load(result.run_dir), env, seed=10_000 + seed)["eval/return"]
    env.close()
    return {
        "library": "shoal",
        "task": TASK,
        "seed": seed,
        "env_steps": result.env_steps,
        "train_s": result.train_s,
        "env_steps_per_s": result.env_steps / result.train_s,
        "score": {"return": score},
    }


def benchmarl_side(python: str, seed: int, frames: int) -> dict[str, Any]:
    args = [python, str(HERE / "benchmarl_side.py"), "--task", TASK, "--seed", str(seed),
            "--frames", str(frames), "--envs", str(ENVS),
            "--frames-per-batch", str(FRAMES_PER_BATCH), "--epochs", str(EPOCHS),
            "--minibatch-frames", str(MINIBATCH_FRAMES), "--eval-episodes", str(EVAL_EPISODES),
            "--threads", "1"]  # fmt: skip
    done = subprocess.run(args, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"BenchMARL failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(lines[-1])


def interval(values: list[float]) -> tuple[float, float, float]:
    """Mean and 95% Student-t confidence interval of the mean."""
    mean, half = t_interval(values)
    return mean, mean - half, mean + half


def main() -> int:
    parser = base_parser(__doc__)
    parser.add_argument("--frames", type=int, default=100_000, help="env steps per run")
    parser.add_argument(
        "--benchmarl-python", default=str(HERE.parent / ".venv-benchmarl/bin/python")
    )
    args = parser.parse_args()
    seeds = 1 if args.quick else args.seeds
    frames = 4_000 if args.quick else args.frames
    if not Path(args.benchmarl_python).exists():
        print(f"{args.benchmarl_python} is missing: run `make bench-marl`", file=sys.stderr)
        return 2
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(seeds):
            for side in ("shoal", "benchmarl"):
                start = time.perf_counter()
                if side == "shoal":
                    run = shoal_side(seed, frames, Path(tmp))
                else:
                    run = benchmarl_side(args.benchmarl_python, seed, frames)
                run["wall_s"] = time.perf_counter() - start
                runs.append(run)
                print(f"{side} seed {seed}: {run['env_steps_per_s']:,.0f} env steps/s, "
                      f"return {run['score']['return']:.2f}", flush=True)  # fmt: skip
    summary = {}
    for library in ("shoal", "benchmarl"):
        mine = [r for r in runs if r["library"] == library]
        rate = median([r["env_steps_per_s"] for r in mine])
        mean, low, high = interval([r["score"]["return"] for r in mine])
        summary[library] = {"env_steps_per_s": rate, "score": mean, "ci95": [low, high]}
    summary["speedup"] = (
        summary["shoal"]["env_steps_per_s"] / summary["benchmarl"]["env_steps_per_s"]
    )
    table = Table(title=f"MAPPO on mpe2 {TASK}_v3, {frames:,} env steps, {seeds} seeds")
    for column in ("library", "env steps/s (median)", "final return (mean, 95% CI)"):
        table.add_column(column)
    for library in ("shoal", "benchmarl"):
        s = summary[library]
        table.add_row(library, f"{s['env_steps_per_s']:,.0f}",
                      f"{s['score']:.2f} [{s['ci95'][0]:.2f}, {s['ci95'][1]:.2f}]")  # fmt: skip
    console = Console()
    console.print(table)
    console.print(f"shoal / BenchMARL env-steps/s: {summary['speedup']:.2f}x")
    if args.json:
        report = {"runs": runs, "summary": summary, "environment": environment()}
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
