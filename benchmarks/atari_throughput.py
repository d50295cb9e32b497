"""Atari: shoal PPO training frames/s on Pong against Stable-Baselines3, and DQN replay memory.

Two measurements, in one process:

* **PPO training frames/s** on ``PongNoFrameskip-v4`` with 8 envs, a fixed budget of whole
  rollouts per repeat, no evaluation. ``sb3 zoo`` is Stable-Baselines3 ``PPO("CnnPolicy")``
  with the rl-baselines3-zoo Atari hyperparameters (``hyperparams/ppo.yml``, ``atari``) on
  ``make_atari_env(..., n_envs=8)`` + ``VecFrameStack(n_stack=4)``, as the zoo builds it;
  ``shoal zoo`` is shoal PPO with the same hyperparameters on shoal's deepmind pipeline
  (``env.atari: deepmind``, ale-py's native vector env) and the Nature CNN in float32;
  ``shoal zoo bf16`` is the same with ``model.precision: bfloat16`` (mixed precision: the
  CNN computes in bfloat16, weights, optimizer and losses stay float32), run only on CPUs with
  native bfloat16 (AMX or AVX512-BF16), where it is shoal's fastest set-up for the zoo's
  hyperparameters. Frames = agent steps x 4 (the frame skip of both pipelines). Repeats
  rotate the order; medians.
* **DQN replay bytes per transition** for 4 x 84 x 84 uint8 observations: the replay of shoal
  DQN with ``frame_replay: true`` (a `shoal.data.replay.ReplayBuffer` with ``frame_stack=4``,
  built by the algorithm itself) against SB3's ``ReplayBuffer(optimize_memory_usage=True)``,
  both from their arrays' ``nbytes`` over the capacity, and extrapolated to 1M transitions.

Targets: shoal / SB3 median training frames/s >= 2x (shoal's fastest configuration: bf16
where the CPU has it, float32 otherwise; both ratios are reported), shoal replay <= 7,680
bytes (7.5 KiB) per transition. Imports and lazy initialisation are excluded by an untimed warm-up.

Usage: ``python benchmarks/atari_throughput.py [--repeats 3] [--json out.json] [--quick]``
(needs ``pip install -e '.[atari,bench]'``). See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import common  # benchmarks/common.py: the script's directory is on sys.path
import gymnasium as gym
import numpy as np
from common import RunRecord, environment, median, record_dict, require_sb3, run_line

from shoal.api import build_config
from shoal.core.threads import set_compute_threads
from shoal.data.frame_replay import bytes_per_transition
from shoal.nn.cnn import native_bfloat16
from shoal.registry import algorithm_for_config

try:
    from stable_baselines3 import PPO as SB3PPO
    from stable_baselines3.common.buffers import ReplayBuffer as SB3ReplayBuffer
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import VecFrameStack
except ImportError:  # pragma: no cover - reported in main()
    pass

ENV_ID = "PongNoFrameskip-v4"
FRAME_SKIP = 4
NUM_ENVS = 8
NUM_STEPS = 128
ROLLOUT = NUM_ENVS * NUM_STEPS  # agent steps per PPO iteration
ITERATIONS = 8  # PPO iterations per timed repeat
QUICK_ITERATIONS = 2
ZOO_TIMESTEPS = 10_000_000  # the zoo's n_timesteps: horizon of both linear schedules
REPLAY_CAPACITY = 10_000  # transitions of the measured replay buffers
MILLION = 1_000_000
OBS_SHAPE = (4, 84, 84)
WARM_UP_SEED = 1000  # a run directory of its own, apart from the timed repeats'

TARGET_RATIO = 2.0  # fastest shoal row / sb3 zoo median training frames/s
TARGET_BYTES = 7.5 * 1024  # 7,680 bytes per transition (KiB)

# rl-baselines3-zoo ppo.yml, atari: n_envs 8, n_steps 128, n_epochs 4, batch_size 256,
# learning_rate lin_2.5e-4, clip_range lin_0.1, vf_coef 0.5, ent_coef 0.01, CnnPolicy; SB3's
# PPO defaults otherwise (gamma 0.99, gae_lambda 0.95, max_grad_norm 0.5, Adam eps 1e-5,
# normalized advantages, no value clipping), which are shoal's defaults too. SB3's CnnPolicy
# shares the Nature CNN between actor and critic, hence model.shared_trunk.
SHOAL_ZOO: dict[str, Any] = {
    "env.atari": "deepmind",
    "env.num_envs": NUM_ENVS,
    "model.encoder": "nature",
    "model.shared_trunk": True,
    "num_steps": NUM_STEPS,
    "num_epochs": 4,
    "minibatch_size": 256,
    "optim.lr": 2.5e-4,
    "optim.lr_schedule": "linear",
    "clip_eps": 0.1,
    "clip_schedule": "linear",
    "optim.anneal_steps": ZOO_TIMESTEPS,
    "vf_coef": 0.5,
    "ent_coef": 0.01,
    "gamma": 0.99,
    "gae_lambda": 0.95,
    "optim.max_grad_norm": 0.5,
}

SB3_ZOO: dict[str, Any] = {
    "n_envs": NUM_ENVS,
    "frame_stack": 4,
    "n_steps": NUM_STEPS,
    "n_epochs": 4,
    "batch_size": 256,
    "learning_rate": "lin_2.5e-4",
    "clip_range": "lin_0.1",
    "vf_coef": 0.5,
    "ent_coef": 0.01,
    "n_timesteps": ZOO_TIMESTEPS,
}


def register_ale() -> None:
    """Register ale-py's ids in Gymnasium (the zoo does it by importing ale_py)."""
    import ale_py

    gym.register_envs(ale_py)


# --- PPO frames/s ------------------------------------------------------------------------------


SHOAL_PRECISIONS = {"shoal zoo": "float32", "shoal zoo bf16": "bfloat16"}


def shoal_configs() -> list[str]:
    """The shoal rows this CPU runs: bf16 only where bfloat16 is native (it is emulated, and
    slower than float32, elsewhere)."""
    return [name for name in SHOAL_PRECISIONS if name == "shoal zoo" or native_bfloat16()]


def shoal_overrides(name: str = "shoal zoo") -> dict[str, Any]:
    precision = SHOAL_PRECISIONS[name]
    return SHOAL_ZOO | {"model.precision": precision, "run.torch_threads": common.TORCH_THREADS}


def shoal_run(workdir: Path, name: str, seed: int, agent_steps: int) -> RunRecord:
    """shoal PPO with the zoo hyperparameters for ``agent_steps``, no evaluation; the clock is
    ``RunResult.train_s`` (env and model set-up, logging and the final checkpoint excluded)."""
    overrides = shoal_overrides(name)
    return common.shoal_run(
        workdir, name, seed, agent_steps, False, algo="ppo", env=ENV_ID, overrides=overrides
    )


def linear(start: float) -> Callable[[float], float]:
    """The zoo's ``lin_`` schedules: SB3 passes the remaining progress, 1 -> 0 over learn()."""
    return lambda remaining: remaining * start


def sb3_model(seed: int) -> Any:
    """The zoo's Atari set-up: AtariWrapper envs (DummyVecEnv), 4 frames stacked, CnnPolicy."""
    register_ale()
    env = VecFrameStack(make_atari_env(ENV_ID, n_envs=NUM_ENVS, seed=seed), n_stack=4)
    return SB3PPO(
        "CnnPolicy",
        env,
        n_steps=NUM_STEPS,
        n_epochs=4,
        batch_size=256,
        learning_rate=linear(2.5e-4),
        clip_range=linear(0.1),
        vf_coef=0.5,
        ent_coef=0.01,
        seed=seed,
        device="cpu",
        verbose=0,
    )


def sb3_run(seed: int, agent_steps: int) -> RunRecord:
    """SB3 with the zoo hyperparameters: ``learn(1e7)`` (the zoo's schedule horizon), stopped
    after the last full rollout of ``agent_steps``; the clock is ``learn()`` up to the stop."""
    record, _ = common.sb3_run(
        "sb3 zoo", ENV_ID, sb3_model, seed, ZOO_TIMESTEPS, False, stop_after=agent_steps
    )
    return record


def warm_up(workdir: Path) -> None:
    """Untimed: one iteration of each library and precision (lazy imports such as
    torch._dynamo on the first optimizer, the ROM, the allocator, oneDNN's kernels)."""
    for name in shoal_configs():
        shoal_run(workdir, name, WARM_UP_SEED, ROLLOUT)
    set_compute_threads(common.TORCH_THREADS)
    model = sb3_model(0)
    model.learn(ROLLOUT)
    model.get_env().close()


def frames_per_s(record: RunRecord) -> float:
    return record.env_steps * FRAME_SKIP / record.train_s


def run_throughput(repeats: int, iterations: int, log: Callable[[str], None]) -> list[RunRecord]:
    records: list[RunRecord] = []
    agent_steps = iterations * ROLLOUT
    with tempfile.TemporaryDirectory(prefix="shoal-bench-") as tmp:
        workdir = Path(tmp)
        log("warm-up (untimed) ...")
        warm_up(workdir)
        for repeat in range(repeats):
            log(f"repeat {repeat}")
            runs = [
                *(
                    lambda s=repeat, n=name: shoal_run(workdir, n, s, agent_steps)
                    for name in shoal_configs()
                ),
                lambda s=repeat: sb3_run(s, agent_steps),
            ]
            shift = repeat % len(runs)  # each configuration goes first in some repeat
            for measure in runs[shift:] + runs[:shift]:
                record = measure()
                records.append(record)
                log(f"{run_line(record)}  {frames_per_s(record):,.0f} frames/s")
    return records


# --- replay memory -----------------------------------------------------------------------------


def shoal_replay_bytes(capacity: int) -> dict[str, Any]:
    """The replay of shoal DQN with ``frame_replay: true`` on the deepmind Pong pipeline, built
    by the algorithm as ``shoal.train`` builds it (one env, as the zoo's DQN), by
    `bytes_per_transition` (every array the buffer owns, by ``nbytes``)."""
    config = build_config(
        "dqn",
        env=ENV_ID,
        **{
            "env.atari": "deepmind",
            "env.num_envs": 1,
            "model.encoder": "nature",
            "frame_replay": True,
            "replay.buffer_size": capacity,
            "run.torch_threads": common.TORCH_THREADS,
        },
    )
    algorithm = algorithm_for_config(config).algorithm_cls(config)
    try:
        replay = algorithm.replay
        obs_shape = tuple(algorithm.sampler.runner.env.observation_space.shape)
        per_transition = bytes_per_transition(replay)
        return {
            "what": "shoal DQN frame_replay (ReplayBuffer frame_stack=4)",
            "obs_shape": list(obs_shape),
            "capacity": replay.capacity,
            "bytes": per_transition * replay.capacity,
            "bytes_per_transition": per_transition,
        }
    finally:
        algorithm.close()


def sb3_replay_bytes(capacity: int, optimize_memory_usage: bool = True) -> dict[str, Any]:
    """SB3's DQN replay for the zoo's Atari observations (4 x 84 x 84 uint8 after
    VecTransposeImage, 6 actions, one env): every ndarray attribute's ``nbytes``."""
    obs_space = gym.spaces.Box(0, 255, OBS_SHAPE, np.uint8)
    buffer = SB3ReplayBuffer(
        capacity,
        obs_space,
        gym.spaces.Discrete(6),
        device="cpu",
        n_envs=1,
        optimize_memory_usage=optimize_memory_usage,
        handle_timeout_termination=not optimize_memory_usage,  # SB3 forbids both at once
    )
    total = sum(v.nbytes for v in vars(buffer).values() if isinstance(v, np.ndarray))
    rows = buffer.buffer_size * buffer.n_envs
    return {
        "what": f"SB3 ReplayBuffer(optimize_memory_usage={optimize_memory_usage})",
        "obs_shape": list(OBS_SHAPE),
        "capacity": rows,
        "bytes": total,
        "bytes_per_transition": total / rows,
    }


def run_memory(capacity: int) -> dict[str, dict[str, Any]]:
    rows = {
        "shoal frame_replay": shoal_replay_bytes(capacity),
        "sb3 optimize_memory_usage": sb3_replay_bytes(capacity, True),
        "sb3 default": sb3_replay_bytes(capacity, False),
    }
    for row in rows.values():
        row["bytes_at_1m"] = row["bytes_per_transition"] * MILLION
    return rows


# --- the benchmark -----------------------------------------------------------------------------


def summarize(records: list[RunRecord], memory: dict[str, dict[str, Any]]) -> dict[str, Any]:
    rows: dict[str, dict[str, Any]] = {}
    for config in (*shoal_configs(), "sb3 zoo"):
        runs = [r for r in records if r.config == config]
        rows[config] = {
            "repeats": len(runs),
            "agent_steps_per_repeat": runs[0].env_steps if runs else 0,
            "median_frames_per_s": median([frames_per_s(r) for r in runs]),
            "median_agent_steps_per_s": median([r.steps_per_s for r in runs]),
            "frames_per_s": [frames_per_s(r) for r in runs],
            "median_setup_s": median([r.setup_s for r in runs]),
        }
    sb3 = rows["sb3 zoo"]["median_frames_per_s"]
    ratios = {name: rows[name]["median_frames_per_s"] / sb3 for name in shoal_configs()}
    fastest = max(ratios, key=ratios.__getitem__)
    ratio = ratios[fastest]
    shoal_bytes = memory["shoal frame_replay"]["bytes_per_transition"]
    sb3_bytes = memory["sb3 optimize_memory_usage"]["bytes_per_transition"]
    checks = {
        "ppo_frames_ratio": {
            "description": f"{fastest} / sb3 zoo median PPO training frames/s, Pong, 8 envs",
            "value": ratio,
            "target": TARGET_RATIO,
            "compare": ">=",
            "pass": ratio >= TARGET_RATIO,
        },
        "replay_bytes": {
            "description": "shoal DQN frame_replay bytes per transition, 4x84x84 uint8",
            "value": shoal_bytes,
            "target": TARGET_BYTES,
            "compare": "<=",
            "pass": shoal_bytes <= TARGET_BYTES,
        },
    }
    extra = {
        "replay_bytes_ratio_sb3_over_shoal": sb3_bytes / shoal_bytes,
        "frames_ratio_over_sb3": ratios,
    }
    return {"rows": rows, "memory": memory, "checks": checks, "extra": extra}


def print_report(summary: dict[str, Any], repeats: int, iterations: int) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=110)
    steps = iterations * ROLLOUT
    table = Table(
        title=f"PPO {ENV_ID}, {NUM_ENVS} envs, {iterations} iterations = {steps:,} agent steps "
        f"({steps * FRAME_SKIP:,} frames) per repeat, median of {repeats}"
    )
    table.add_column("config")
    table.add_column("training frames/s", justify="right")
    table.add_column("agent steps/s", justify="right")
    table.add_column("each repeat (frames/s)", justify="right")
    table.add_column("set-up s", justify="right")
    for name, row in summary["rows"].items():
        table.add_row(
            name,
            f"{row['median_frames_per_s']:,.0f}",
            f"{row['median_agent_steps_per_s']:,.0f}",
            ", ".join(f"{v:,.0f}" for v in row["frames_per_s"]),
            f"{row['median_setup_s']:.2f}",
        )
    console.print(table)

    table = Table(title="DQN replay memory, 4x84x84 uint8 observations, one env")
    table.add_column("buffer")
    table.add_column("capacity", justify="right")
    table.add_column("bytes / transition", justify="right")
    table.add_column("at 1M transitions", justify="right")
    for row in summary["memory"].values():
        table.add_row(
            row["what"],
            f"{row['capacity']:,}",
            f"{row['bytes_per_transition']:,.1f}",
            f"{row['bytes_at_1m'] / 2**30:.2f} GiB ({row['bytes_at_1m'] / 1e9:.2f} GB)",
        )
    console.print(table)

    table = Table(title="targets")
    table.add_column("check")
    table.add_column("value", justify="right")
    table.add_column("target", justify="right")
    table.add_column("result")
    for check in summary["checks"].values():
        value, target = check["value"], check["target"]
        fmt = (lambda v: f"{v:,.0f} B") if target >= 1000 else (lambda v: f"{v:.2f}x")
        table.add_row(
            check["description"],
            fmt(value),
            f"{check['compare']} {fmt(target)}",
            "[green]PASS[/green]" if check["pass"] else "[red]FAIL[/red]",
        )
    console.print(table)
    each = ", ".join(f"{k} {v:.2f}x" for k, v in summary["extra"]["frames_ratio_over_sb3"].items())
    bf16 = "" if native_bfloat16() else " (no bf16 row: this CPU has no native bfloat16)"
    console.print(
        f"over sb3 zoo: {each}{bf16}. "
        f"frames = agent steps x {FRAME_SKIP} (frame skip); torch threads = "
        f"{common.TORCH_THREADS} for both libraries; no evaluation; imports excluded (untimed "
        f"warm-up); env and model set-up excluded for both. SB3 / shoal replay bytes: "
        f"{summary['extra']['replay_bytes_ratio_sb3_over_shoal']:.2f}x; 1 KiB = 1024 bytes."
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats per library")
    parser.add_argument(
        "--iterations",
        type=int,
        default=ITERATIONS,
        help=f"PPO iterations ({ROLLOUT} agent steps each) per repeat",
    )
    parser.add_argument(
        "--threads", type=int, default=common.TORCH_THREADS, help="torch threads, both libraries"
    )
    parser.add_argument(
        "--replay-capacity",
        type=int,
        default=REPLAY_CAPACITY,
        help="transitions of the replay buffers whose bytes are measured",
    )
    parser.add_argument("--json", type=Path, help="also write every run and the summary here")
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"smoke check: 1 repeat of {QUICK_ITERATIONS} iterations",
    )
    args = parser.parse_args(argv)
    if not require_sb3():
        return 2
    repeats = 1 if args.quick else args.repeats
    iterations = QUICK_ITERATIONS if args.quick else args.iterations
    if repeats < 1 or iterations < 1 or args.threads < 1 or args.replay_capacity < 100:
        parser.error("--repeats, --iterations and --threads must be >= 1, --replay-capacity >= 100")
    common.TORCH_THREADS = args.threads  # read by common.sb3_run and common.environment

    started = time.perf_counter()
    log = lambda line: print(line, flush=True)  # noqa: E731
    log("replay memory ...")
    memory = run_memory(args.replay_capacity)
    records = run_throughput(repeats, iterations, log)
    summary = summarize(records, memory)
    print()
    print_report(summary, repeats, iterations)
    print(f"benchmark took {time.perf_counter() - started:.0f} s")
    if args.json is not None:
        payload = {
            "benchmark": "atari_throughput",
            "settings": {
                "env_id": ENV_ID,
                "repeats": repeats,
                "iterations": iterations,
                "agent_steps_per_repeat": iterations * ROLLOUT,
                "frame_skip": FRAME_SKIP,
                "replay_capacity": args.replay_capacity,
                "shoal_zoo_overrides": {n: shoal_overrides(n) for n in shoal_configs()},
                "sb3_zoo": SB3_ZOO,
            },
            "environment": environment(),
            "summary": summary,
            "runs": [record_dict(r) | {"frames_per_s": frames_per_s(r)} for r in records],
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(payload, indent=2))
        print(f"wrote {args.json}")
    return 0 if all(c["pass"] for c in summary["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
