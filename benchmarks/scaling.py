"""Scaling on Ray: shoal's RaySampler and IMPALA with 1, 2 and 4 runners, against RLlib.

In one run, on this machine:

1. **Sampling** CartPole-v1: env-steps/s of shoal's `RaySampler` with 1, 2 and 4 runners of
   ``--envs`` envs each (``--steps`` steps per env per call), of shoal's in-process
   `LocalSampler` with the same total number of envs (the overhead of going through Ray), and
   of RLlib's env runners with the same runners and envs (`rllib_side.py sample`).
2. **IMPALA training** throughput (env-steps/s over the training iterations) with 1, 2 and 4
   runners.
3. **Solving CartPole**: shoal PPO (the ``ppo-cartpole`` tuned example split over
   ``--runners 2``, 64 envs each) against RLlib PPO with 2 env runners (its CartPole defaults),
   each seed in a fresh process; wall-clock from starting Ray to solved. shoal is solved when
   its deterministic evaluation (20 episodes on separate envs) reaches 475, with the clock
   paused while evaluating (as in ppo_cartpole.py; the figure with evaluation is reported
   too); RLlib when its mean training episode return reaches 475 (its own criterion, which
   needs no evaluation and is the more lenient of the two).

4. **Training with runners** (``--parts training``): env-steps/s of whole training
   iterations (sampling, storing and learning) of SAC on HalfCheetah-v5, DQN and PPO on
   CartPole-v1 with 0 (in-process), 1 and 2 runners (and DQN on Pong, ``--training-rows
   dqn-pong``), in step with learning and sampling one
   iteration ahead (SAC and DQN: ``replay.max_lag 1``; PPO: APPO, its asynchronous form,
   ``max_lag 1``). Every row of one algorithm learns at the same ratio of updates to env
   steps. Timed after the replay learners' ``learning_starts``.
5. **Training beside RLlib** (``--parts rllib-training``): SAC on Pendulum-v1 and DQN on
   CartPole-v1 with 1 and 2 runners in step, shoal against RLlib (`rllib_side.py train`) with
   the same envs per runner, rollout length, batch size, network and updates per env step
   (RLlib's ``training_intensity`` set to give them; the ratio it reached is printed).

Each figure is the median of ``--repeats`` measurements (solving: of ``--seeds`` seeds). On a
2-core machine every process competes for the same cores, so throughput flattens beyond 1-2
runners; the table says so rather than hiding it.

Usage: ``python benchmarks/scaling.py [--rllib-python .venv-rllib/bin/python] [--quick]``;
``make bench-scaling`` creates RLlib's virtual environment and runs it.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

import shoal
from shoal.algos.policy_gradient.ppo import PPOConfig, build_model
from shoal.collect import make_sampler
from shoal.config import EnvConfig, RunConfig
from shoal.distributed import require_ray

HERE = Path(__file__).parent
TARGET_SAMPLING_RATIO = 3.0  # shoal RaySampler env-steps/s / RLlib's, same runners and envs
TARGET_SOLVE_SPEEDUP = 10.0  # RLlib PPO solve wall-clock / shoal PPO --runners 2


def sampler_rate(runners: int, envs: int, steps: int, calls: int, repeats: int) -> dict:
    """Env-steps/s of one sampler: Ray runners (``runners`` >= 1) or the local sampler with
    ``-runners`` times ``envs`` envs (``runners`` < 0)."""
    local = runners < 0
    count = -runners if local else runners
    env = EnvConfig(id="CartPole-v1", num_envs=envs * count if local else envs)
    config = PPOConfig(env=env, num_steps=steps, minibatch_size=steps)
    run = RunConfig(runners=0 if local else count)
    begin = time.perf_counter()
    sampler = make_sampler(env, functools.partial(build_model, config), steps, run)
    setup_s = time.perf_counter() - begin
    model = build_model(config, sampler.observation_space, sampler.action_space)
    sampler.set_weights(model.state_dict())
    sampler.sample()  # warm-up
    rates = []
    for _ in range(repeats):
        begin = time.perf_counter()
        for _ in range(calls):
            rollout, _ = sampler.sample()
        rates.append(calls * rollout.rewards.numel() / (time.perf_counter() - begin))
    sampler.close()
    return {"steps_per_s": statistics.median(rates), "rates": rates, "setup_s": setup_s}


def impala_rate(runners: int, total_steps: int, repeats: int) -> dict | None:
    if "impala" not in shoal.ALGORITHMS:
        return None
    rates = []
    for seed in range(repeats):
        result = shoal.train(
            "impala",
            **{
                "run.runners": runners,
                "run.seed": seed,
                "run.total_steps": total_steps,
                "run.eval_every_steps": 0,
                "run.checkpoint_every_steps": 0,
                "run.console": False,
                "run.tensorboard": False,
                "run.run_dir": f"/tmp/shoal-scaling/impala-{runners}-{seed}-{time.time_ns()}",
            },
        )
        rates.append(result.env_steps / result.train_s)
    return {"steps_per_s": statistics.median(rates), "rates": rates}


TRAINING = {
    # name: (algorithm, env, settings); each row's ratio of updates to env steps is the same
    "sac": ("sac", "HalfCheetah-v5", {
        "env.num_envs": 1, "rollout_steps": 16, "replay.gradient_steps": 16,
        "replay.batch_size": 256, "replay.learning_starts": 2_000, "model.hidden": (256, 256),
    }),
    "dqn": ("dqn", "CartPole-v1", {
        "env.num_envs": 4, "rollout_steps": 16, "replay.gradient_steps": 16,
        "replay.batch_size": 64, "replay.learning_starts": 1_000, "model.hidden": (64, 64),
    }),
    # beside RLlib's SAC (its venv has no MuJoCo): its default 256-256 networks
    "sac-pendulum": ("sac", "Pendulum-v1", {
        "env.num_envs": 1, "rollout_steps": 16, "replay.gradient_steps": 16,
        "replay.batch_size": 256, "replay.learning_starts": 1_000, "model.hidden": (256, 256),
    }),
    "ppo": ("ppo", "CartPole-v1", {"env.num_envs": 8, "num_steps": 128}),
    # dqn-pong's shape (one update per 4 env steps, frames stored once), where acting (the
    # Atari preprocessing and the CNN's forward) costs about what learning does
    "dqn-pong": ("dqn", "PongNoFrameskip-v4", {
        "env.atari": "deepmind", "env.num_envs": 4, "rollout_steps": 4,
        "replay.gradient_steps": 4, "replay.batch_size": 32, "replay.learning_starts": 2_000,
        "replay.buffer_size": 20_000, "model.encoder": "nature", "frame_replay": True,
    }),
}  # fmt: skip
TARGET_AHEAD_SPEEDUP = 1.5  # SAC, 1 runner sampling ahead / in-process


def training_rate(row: str, runners: int, ahead: bool, seconds: float) -> dict:
    """Env-steps/s of training iterations (after the replay's learning_starts), over about
    ``seconds`` of training."""
    name, env_id, settings = TRAINING[row]
    if ahead and name == "ppo":  # PPO sampling ahead is APPO (its settings in its ppo block)
        name = "appo"
        settings = {"max_lag": 1, **{f"ppo.{k}": v for k, v in settings.items()
                                     if not k.startswith("env.")}}  # fmt: skip
        settings["env.num_envs"] = TRAINING[row][2]["env.num_envs"]
    elif ahead:
        settings = {**settings, "replay.max_lag": 1}
    spec = shoal.ALGORITHMS[name]
    config = spec.default_config(**{"env.id": env_id, "run.runners": runners, **settings})
    torch.manual_seed(0)
    algo = spec.algorithm_cls(config)
    try:
        starts = getattr(getattr(config, "replay", None), "learning_starts", 0)
        while algo.env_steps <= starts:
            algo.train_iteration()
        algo.train_iteration()  # warm-up of the learner
        begin, steps0 = time.perf_counter(), algo.env_steps
        while time.perf_counter() - begin < seconds:
            algo.train_iteration()
        elapsed = time.perf_counter() - begin
        return {"steps_per_s": (algo.env_steps - steps0) / elapsed, "seconds": elapsed}
    finally:
        algo.close()


def shoal_ppo_solve_child(seed: int) -> None:
    """Runs in a fresh process: Ray start + PPO on 2 runners until solved."""
    workers = require_ray()  # imports Ray: imports are outside the clock, as on RLlib's side
    start = time.perf_counter()
    workers.connect(None, num_cpus=max(os.cpu_count() or 1, 3))  # as RaySampler would start it
    connect_s = time.perf_counter() - start
    result = shoal.train(
        tuned="ppo-cartpole",
        **{
            "run.runners": 2,
            "env.num_envs": 64,
            "run.seed": seed,
            "run.console": False,
            "run.tensorboard": False,
            "run.run_dir": f"/tmp/shoal-scaling/ppo-{seed}-{time.time_ns()}",
        },
    )
    out = {
        "solved": result.solved,
        # Ray start + envs and actors + training; the evaluations that decide "solved" are
        # excluded (RLlib's criterion, its training return, costs it no evaluation either).
        "wall_s": connect_s + result.setup_s + result.train_s,
        "wall_with_eval_s": time.perf_counter() - start,
        "ray_start_s": connect_s,
        "setup_s": result.setup_s,
        "train_s": result.train_s,
        "env_steps": result.env_steps,
        "return": result.eval_return,
    }
    print("RESULT " + json.dumps(out), flush=True)


def child(command: list[str]) -> dict:
    """Run ``command`` and return the JSON of its RESULT line."""
    proc = subprocess.run(command, capture_output=True, text=True, cwd=HERE.parent)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise RuntimeError(f"{command[:3]} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rllib-python", default=str(HERE.parent / ".venv-rllib/bin/python"))
    parser.add_argument("--runners", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--envs", type=int, default=8, help="envs per runner")
    parser.add_argument("--steps", type=int, default=64, help="steps per env per sample call")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seeds", type=int, default=3, help="seeds of the solve comparison")
    parser.add_argument("--impala-steps", type=int, default=100_000)
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--quick", action="store_true", help="one repeat, one seed (smoke)")
    parser.add_argument(
        "--parts",
        nargs="+",
        default=["sampling", "impala", "solve", "training"],
        help="what to measure",
    )
    parser.add_argument("--training-s", type=float, default=20.0, help="seconds a row trains")
    parser.add_argument("--training-rows", nargs="+", default=["sac", "dqn", "ppo"],
                        choices=list(TRAINING))  # fmt: skip
    parser.add_argument("--ppo-solve-child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.ppo_solve_child is not None:
        shoal_ppo_solve_child(args.ppo_solve_child)
        return 0
    if args.quick:
        args.repeats, args.seeds, args.calls, args.impala_steps = 1, 1, 5, 20_000
    torch.set_num_threads(1)
    if "training" in args.parts or "rllib-training" in args.parts:
        figures = {}
        if "training" in args.parts:
            require_ray().connect(None)
            figures["training"] = training_table(args)
            require_ray().shutdown()
        if "rllib-training" in args.parts:
            figures["rllib_training"] = rllib_table(args)
        if args.json:
            Path(args.json).write_text(json.dumps(figures, indent=2, default=str))
        if set(args.parts) <= {"training", "rllib-training"}:
            return 0
    if not Path(args.rllib_python).exists():
        print(f"RLlib's Python not found at {args.rllib_python}: run `make bench-scaling`")
        return 2
    torch.set_num_threads(1)
    figures: dict = {"settings": vars(args), "sampling": {}, "impala": {}, "solve": {}}

    # 1. Sampling, shoal and RLlib alternating runner count by runner count.
    sample_args = ["--envs", str(args.envs), "--steps", str(args.steps)]
    sample_args += ["--calls", str(args.calls), "--repeats", str(args.repeats)]
    require_ray().connect(None)
    for n in args.runners if "sampling" in args.parts else []:
        ray_rate = sampler_rate(n, args.envs, args.steps, args.calls, args.repeats)
        local_rate = sampler_rate(-n, args.envs, args.steps, args.calls, args.repeats)
        rllib = child(
            [args.rllib_python, "benchmarks/rllib_side.py", "sample", "--runners", str(n)]
            + sample_args
        )
        figures["sampling"][n] = {"shoal_ray": ray_rate, "shoal_local": local_rate, "rllib": rllib}
        print(
            f"sampling  runners {n} x {args.envs} envs: shoal Ray {ray_rate['steps_per_s']:>9,.0f}"
            f"  shoal local {local_rate['steps_per_s']:>9,.0f}  RLlib {rllib['steps_per_s']:>8,.0f}"
            f"  env-steps/s   (shoal/RLlib {ray_rate['steps_per_s'] / rllib['steps_per_s']:.1f}x,"
            f" Ray/local {ray_rate['steps_per_s'] / local_rate['steps_per_s']:.2f})",
            flush=True,
        )

    # 2. IMPALA training throughput.
    for n in args.runners if "impala" in args.parts else []:
        rate = impala_rate(n, args.impala_steps, args.repeats)
        figures["impala"][n] = rate
        if rate is not None:
            print(f"IMPALA    runners {n}: {rate['steps_per_s']:>9,.0f} env-steps/s", flush=True)
    require_ray().shutdown()

    # 3. Solving CartPole, each seed in fresh processes, shoal and RLlib interleaved.
    shoal_runs, rllib_runs = [], []
    for seed in range(args.seeds if "solve" in args.parts else 0):
        shoal_runs.append(child([sys.executable, __file__, "--ppo-solve-child", str(seed)]))
        rllib_runs.append(
            child(
                [
                    args.rllib_python,
                    "benchmarks/rllib_side.py",
                    "ppo",
                    "--runners",
                    "2",
                    "--seed",
                    str(seed),
                ]
            )
        )
        print(f"solve     seed {seed}: shoal {shoal_runs[-1]}  RLlib {rllib_runs[-1]}", flush=True)
    figures["solve"] = {"shoal": shoal_runs, "rllib": rllib_runs}
    checks = report(args, figures)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2, default=str))
    return 0 if all(checks.values()) else 1


RLLIB_ROWS = ("sac-pendulum", "dqn")
TARGET_RLLIB_TRAINING_RATIO = 3.0  # shoal / RLlib training env-steps/s, same runners


def rllib_training(args: argparse.Namespace, row: str, runners: int) -> dict:
    """RLlib's training env-steps/s on ``row``'s env and settings, in its own environment."""
    name, env_id, settings = TRAINING[row]
    envs, fragment = settings["env.num_envs"], settings["rollout_steps"]
    command = [args.rllib_python, "benchmarks/rllib_side.py", "train", "--algo", name]
    command += ["--env", env_id, "--runners", str(runners), "--envs", str(envs)]
    command += ["--fragment", str(fragment), "--batch", str(settings["replay.batch_size"])]
    # shoal: gradient_steps per runner's rollout; RLlib: updates per round of all runners
    command += ["--updates", str(settings["replay.gradient_steps"] * max(1, runners))]
    command += ["--hidden", *map(str, settings["model.hidden"])]
    command += ["--learning-starts", str(settings["replay.learning_starts"])]
    return child(command + ["--seconds", str(args.training_s)])


def rllib_table(args: argparse.Namespace) -> dict:
    """SAC and DQN training beside RLlib's, in step, 1 and 2 runners; repeats interleaved."""
    figures: dict = {}
    ratios = []
    for row in RLLIB_ROWS:
        figures[row] = {}
        for runners in (1, 2):
            ours, theirs, ratio_seen = [], [], []
            for _ in range(args.repeats):
                ours.append(training_rate(row, runners, False, args.training_s)["steps_per_s"])
                require_ray().shutdown()  # no idle Ray of ours beside RLlib's
                rllib = rllib_training(args, row, runners)
                theirs.append(rllib["steps_per_s"])
                ratio_seen.append(rllib["updates_per_env_step"])
            a, b = statistics.median(ours), statistics.median(theirs)
            ratios.append(a / b)
            figures[row][runners] = {"shoal": ours, "rllib": theirs, "rllib_ratio": ratio_seen}
            print(f"{row:>12} runners {runners}: shoal {a:>8,.1f}  RLlib {b:>8,.1f} env-steps/s"
                  f"  ({a / b:.1f}x; RLlib's updates per env step "
                  f"{statistics.median(ratio_seen):.3f})", flush=True)  # fmt: skip
    ok = min(ratios) >= TARGET_RLLIB_TRAINING_RATIO
    print(f"{'PASS' if ok else 'FAIL'}  SAC and DQN training >= {TARGET_RLLIB_TRAINING_RATIO}x "
          f"RLlib's env-steps/s at equal runners: {min(ratios):.1f}x at least")  # fmt: skip
    return figures


def training_table(args: argparse.Namespace) -> dict:
    """Row (a): each algorithm with 0, 1 and 2 runners, in step and sampling ahead; the
    repeats interleaved so that a slow moment of the machine hits every setting alike."""
    settings = [(n, ahead) for n in (0, 1, 2) for ahead in (False, True) if n or not ahead]
    figures: dict = {}
    for row in args.training_rows:
        rates: dict = {setting: [] for setting in settings}
        for _ in range(args.repeats):
            for runners, ahead in settings:
                rates[(runners, ahead)].append(
                    training_rate(row, runners, ahead, args.training_s)["steps_per_s"]
                )
        base = statistics.median(rates[(0, False)])
        print(f"\n{row}: env-steps/s of training, median of {args.repeats}")
        print("| runners | in step | sampling ahead | ahead / in-process |")
        print("|---|---|---|---|")
        figures[row] = {}
        for runners in (0, 1, 2):
            sync = statistics.median(rates[(runners, False)])
            cells = [f"{sync:,.0f}"]
            ahead = None
            if runners:
                ahead = statistics.median(rates[(runners, True)])
                cells += [f"{ahead:,.0f}", f"{ahead / base:.2f}x"]
            else:
                cells += ["(needs runners)", "1.00x"]
            print(f"| {runners} | " + " | ".join(cells) + " |", flush=True)
            figures[row][runners] = {"in_step": sync, "ahead": ahead,
                                     "rates": {str(k): v for k, v in rates.items()}}  # fmt: skip
    if "sac" in figures and figures["sac"][1]["ahead"]:
        speedup = figures["sac"][1]["ahead"] / figures["sac"][0]["in_step"]
        ok = speedup >= TARGET_AHEAD_SPEEDUP
        print(f"{'PASS' if ok else 'FAIL'}  SAC, 1 runner sampling ahead >= "
              f"{TARGET_AHEAD_SPEEDUP}x in-process: {speedup:.2f}x")  # fmt: skip
    return figures


def report(args: argparse.Namespace, figures: dict) -> dict[str, bool]:
    """Print the tables and the targets' checks (of the parts that were measured)."""
    checks = {}
    if figures["sampling"] or figures["impala"]:
        print(
            "\n| runners | shoal Ray | shoal local (same envs) | RLlib | shoal / RLlib | IMPALA |"
        )
        print("|---|---|---|---|---|---|")
        ratios = []
        for n in args.runners:
            s, impala = figures["sampling"].get(n), figures["impala"].get(n)
            cells = ["n/a"] * 4
            if s:
                ratio = s["shoal_ray"]["steps_per_s"] / s["rllib"]["steps_per_s"]
                ratios.append(ratio)
                cells = [
                    f"{s['shoal_ray']['steps_per_s']:,.0f}",
                    f"{s['shoal_local']['steps_per_s']:,.0f}",
                    f"{s['rllib']['steps_per_s']:,.0f}",
                    f"{ratio:.1f}x",
                ]
            cells.append(f"{impala['steps_per_s']:,.0f}" if impala else "n/a")
            print(f"| {n} | " + " | ".join(cells) + " |")
        if ratios:
            name = f"sampling >= {TARGET_SAMPLING_RATIO}x RLlib at every runner count"
            checks[name] = min(ratios) >= TARGET_SAMPLING_RATIO
    shoal_runs, rllib_runs = figures["solve"]["shoal"], figures["solve"]["rllib"]
    if shoal_runs:
        shoal_s = statistics.median(r["wall_s"] for r in shoal_runs)
        with_eval = statistics.median(r["wall_with_eval_s"] for r in shoal_runs)
        rllib_s = statistics.median(r["wall_s"] for r in rllib_runs)
        solved = all(r["solved"] for r in shoal_runs) and all(r["solved"] for r in rllib_runs)
        print(
            f"\nsolve CartPole (median of {len(shoal_runs)} seeds): shoal PPO --runners 2"
            f" {shoal_s:.1f} s ({with_eval:.1f} s with evaluation), RLlib PPO 2 runners"
            f" {rllib_s:.1f} s: {rllib_s / shoal_s:.1f}x ({rllib_s / with_eval:.1f}x);"
            f" all solved: {solved}"
        )
        name = f"PPO --runners 2 solves >= {TARGET_SOLVE_SPEEDUP}x faster than RLlib"
        checks[name] = solved and rllib_s / shoal_s >= TARGET_SOLVE_SPEEDUP
    for name, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}")
    return checks


if __name__ == "__main__":
    sys.exit(main())
