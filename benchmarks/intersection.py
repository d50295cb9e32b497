"""The 4-lane intersection (``shoal/intersection-v0``): simulation speed and the SUMO
validation.

``--speed``: env-steps/s and agent-steps/s (4 agents an env), uniformly random
lane-following actions, heavy background traffic (``traffic high``), resets included, each
figure the median of ``--repeats`` timed blocks of ``--seconds`` after 20 untimed steps:
the built-in simulator at 1, 64 and 1024 envs on one CPU thread; the SUMO backend with one
env in-process and with 4 envs in 4 worker processes; the SMARTS adapter with one env;
highway-env's
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

``--experiments``: the four comparisons of Biswas and Biswas ("Autonomous driving using
Multi-Agent RL"), on the built-in intersection at low traffic with random routes, each
variant ``--seeds`` times for ``--steps`` env steps (the 2-core budget; the paper trained
far longer, pass ``--steps`` for more): (a) MADDPG against MAPPO with shared weights, (b)
MADDPG with rank-based prioritized replay against uniform replay, (c) MADDPG with batch 64
against 1024, (d) distributed MADDPG (one collector, two asynchronous learners, Ray) against
single-process MADDPG. Each variant is a tuned example (`VARIANTS`): MADDPG as the paper,
64-64 ReLU networks, critic lr 1e-3, actor lr 1e-4, batch 1024 (16 envs, one gradient step
per 4 steps of each env); MAPPO as ``mappo-intersection``. Reports each agent's mean
training-episode return against env steps with 95% t intervals over seeds (one PNG per
comparison, four panels), completion and collision rates of each final deterministic policy
on 10 evaluation episodes at low and at high traffic, training wall-clock, and the
MAPPO/MADDPG wall-clock ratio (the paper saw 3-3.5).

``--wall-clock``: the training wall-clock of every variant at equal env steps, measured as
ratios in one sitting (the machine's speed drifts between sittings by a factor of up to
two): ``--repeats`` rounds, each training every variant once for ``--steps`` env steps (a
fresh ``shoal train --tuned`` process, as ``shoal experiment`` starts its runs; no
evaluation), the variants' order reversed every other round; each variant's median
training seconds (its iterations' times summed) and its ratio to MADDPG's.

``--experiments --from-experiment DIR`` trains nothing: it reads the finished runs of a
``shoal experiment`` directory of these tuned examples (``experiments/biswas_intersection.yaml``:
long comparisons go through ``shoal experiment``, which resumes after a kill), takes each
run's training curves and training wall-clock (its iterations' times summed) from its
``metrics.jsonl`` and evaluates its final policy the same way, once: the rates are kept in
the run's ``final_rates.json`` (which `benchmarks/archive_experiment.py` keeps with the run).

Usage: ``python benchmarks/intersection.py [--speed] [--validate] [--experiments
[--from-experiment DIR]] [--wall-clock] [--repeats 3] [--seconds 3] [--episodes 800]
[--seeds 3] [--steps 150000] [--highway-python PY] [--results DIR] [--json F]``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import shoal
from shoal.collect.evaluate import evaluate, evaluate_joint
from shoal.config import EnvConfig, replace
from shoal.core.stats import t_interval
from shoal.core.threads import set_compute_threads
from shoal.envs import make_env
from shoal.envs.heuristics import IntersectionHeuristic
from shoal.envs.intersection.env import make_intersection
from shoal.envs.make import make_multi_agent_env
from shoal.nn.policy import JointPolicy

TARGET = 100_000
"""Agent-steps/s of the built-in intersection at 1024 envs."""
SUMO_TARGET = 2_000
"""Env-steps/s of one SUMO process."""
TOLERANCE = 0.05
"""Largest gap between the backends' completion (or collision) rates under one policy."""


def make(backend: str, num_envs: int, seed: int = 0, **kwargs):
    if backend == "smarts":
        config = EnvConfig(id="shoal/smarts-intersection-v0", num_envs=num_envs,
                           kwargs={"seed": seed, **kwargs})  # fmt: skip
        return make_multi_agent_env(config)
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
    if importlib.util.find_spec("smarts") is not None:
        cases.append(("smarts", 1))
    else:
        print("SMARTS is not installed (pip install 'shoal[smarts]'): no SMARTS row")
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


VARIANTS = {
    "MADDPG": "maddpg-intersection",
    "MAPPO (shared weights)": "mappo-intersection",
    "MADDPG + rank PER": "maddpg-per-intersection",
    "MADDPG, batch 64": "maddpg-batch64-intersection",
    "distributed MADDPG": "maddpg-distributed-intersection",
}
"""Each comparison's variants: tuned examples (their settings and the 2-core budget)."""
EXPERIMENTS = {
    "a_maddpg_vs_mappo": ("MADDPG", "MAPPO (shared weights)"),
    "b_per_vs_uniform": ("MADDPG + rank PER", "MADDPG"),
    "c_batch_64_vs_1024": ("MADDPG, batch 64", "MADDPG"),
    "d_distributed_vs_single": ("distributed MADDPG", "MADDPG"),
}
AGENTS = tuple(f"agent_{i}" for i in range(4))


def train_variant(name: str, seed: int, steps: int, root: Path) -> dict:
    """One training run: per-agent training-episode returns against env steps, the final
    policy's rates at both traffic settings, and the training wall-clock."""
    curves: dict[str, list[tuple[int, float, float]]] = {a: [] for a in AGENTS}

    def record(step: int, metrics: dict[str, float]) -> None:
        add_point(curves, step, metrics)

    run_dir = root / f"{VARIANTS[name]}-{seed}"
    result = shoal.train(
        tuned=VARIANTS[name], seed=seed, run_dir=str(run_dir), total_steps=steps,
        on_iteration=record,
        **{"run.eval_every_steps": 0, "run.console": False, "run.tensorboard": False},
    )  # fmt: skip
    policy = shoal.load(result.run_dir)
    rates = {}
    for traffic in ("low", "high"):
        rates[traffic] = final_rates(policy, traffic, seed)
    return {"curves": curves, "rates": rates, "train_s": result.train_s, "wall_s": result.wall_s}


def read_variants(directory: Path) -> dict[str, list[dict]]:
    """The finished runs of a ``shoal experiment`` directory whose variants are tuned
    examples of `VARIANTS`, as `train_variant` records, by variant name; the run's seed index
    ``k`` (its name's ``-s<k>``) seeds its evaluation as `train_variant`'s seed does."""
    plan = json.loads((directory / "experiment.json").read_text())
    status = json.loads((directory / "status.json").read_text())
    names = {tuned: name for name, tuned in VARIANTS.items()}
    bases = {v: own.get("base") for v, own in plan["spec"]["variants"].items()}
    runs: dict[str, list[dict]] = {}
    for entry in plan["runs"]:
        name = names.get(bases.get(entry["variant"]))
        if name is None or status.get(entry["name"], {}).get("state") != "done":
            continue
        run_dir = directory / entry["name"]
        curves: dict[str, list[tuple[int, float, float]]] = {a: [] for a in AGENTS}
        for line in (run_dir / "metrics.jsonl").read_text().splitlines():
            row = json.loads(line)
            add_point(curves, row["step"], row)
        train_s = training_seconds(run_dir)
        k = int(entry["name"].rsplit("-s", 1)[1])
        cached = run_dir / "final_rates.json"  # (kept by benchmarks/archive_experiment.py)
        if cached.exists():
            rates = json.loads(cached.read_text())
        else:
            policy = shoal.load(run_dir)
            rates = {traffic: final_rates(policy, traffic, k) for traffic in ("low", "high")}
            cached.write_text(json.dumps(rates, indent=2))
        budget = json.loads((run_dir / "config.json").read_text())["run"]["total_steps"]
        runs.setdefault(name, []).append(
            {"curves": curves, "rates": rates, "train_s": train_s, "budget": budget}
        )
        print(f"{name}, {entry['name']}: train {train_s:.0f} s, completion "
              f"{rates['low']['completion_rate']:.2f} at low traffic", flush=True)  # fmt: skip
    return runs


def final_rates(policy, traffic: str, seed: int, episodes: int = 10) -> dict[str, float]:
    """Completion and collision rates of the deterministic ``policy`` on the first episode of
    ``episodes`` envs at ``traffic``."""
    config = policy.config.env
    config = replace(config, num_envs=episodes, kwargs={**config.kwargs, "traffic": traffic})
    joint = isinstance(policy, JointPolicy)
    env = (make_multi_agent_env if joint else make_env)(config)
    try:
        metrics = (evaluate_joint if joint else evaluate)(policy, env, seed=10_000 + seed)
    finally:
        env.close()
    return {k: metrics[f"eval/{k}"] for k in ("completion_rate", "collision_rate")}


def add_point(curves: dict[str, list], step: int, row: dict) -> None:
    """Each agent's mean return over the training episodes that ended in a metrics row, with
    their number (``episode/count``), to ``curves``."""
    for agent in AGENTS:
        if f"episode/return/{agent}" in row:
            episodes = float(row.get("episode/count", 1))
            curves[agent].append((step, row[f"episode/return/{agent}"], episodes))


def binned(curve: list[tuple[int, float, float]], edges: np.ndarray) -> np.ndarray:
    """The mean return of the training episodes that ended in each bin of env steps (NaN
    where none): the rows' means weighted by their episodes, so that a bin's value does not
    depend on how the rows were logged (per iteration, or merged by
    benchmarks/archive_experiment.py). The last bin also takes the rows past its edge (a run
    stops at the first rollout that reaches its budget)."""
    steps, values, episodes = (np.array(column, dtype=float) for column in zip(*curve, strict=True))
    out = np.full(len(edges) - 1, np.nan)
    for i in range(len(out)):
        upper = edges[i + 1] if i < len(out) - 1 else np.inf
        inside = (steps > edges[i]) & (steps <= upper) & (episodes > 0)
        if inside.any():
            out[i] = np.average(values[inside], weights=episodes[inside])
    return out


def summarize_variant(runs: list[dict], edges: np.ndarray) -> dict:
    per_agent = {}
    for agent in AGENTS:
        rows = np.stack([binned(r["curves"][agent], edges) for r in runs])  # [seeds, bins]
        stats = [t_interval([v for v in col if not np.isnan(v)]) if (~np.isnan(col)).any()
                 else (np.nan, np.nan) for col in rows.T]  # fmt: skip
        per_agent[agent] = {"mean": [m for m, _ in stats], "ci95": [h for _, h in stats],
                            "final": t_interval(list(rows[:, -1]))}  # fmt: skip
    rates = {
        traffic: {k: t_interval([r["rates"][traffic][k] for r in runs])
                  for k in ("completion_rate", "collision_rate")}
        for traffic in ("low", "high")
    }  # fmt: skip
    train_s = t_interval([r["train_s"] for r in runs])
    return {"per_agent": per_agent, "rates": rates, "train_s": train_s,
            "drops": t_interval([drops(r, edges) for r in runs])}  # fmt: skip


def drops(run: dict, edges: np.ndarray) -> float:
    """How far from monotonic a run's learning is (the paper's finding 2 says PER makes it
    "almost monotonic"): the sum of the falls of its team curve (the agents' mean
    training-episode return, binned) from one bin to the next, in return units; 0 for a curve
    that never falls."""
    team = np.nanmean(np.stack([binned(run["curves"][a], edges) for a in AGENTS]), axis=0)
    team = team[~np.isnan(team)]
    return float(np.clip(team[:-1] - team[1:], 0, None).sum())


def plot(experiment: str, names: tuple[str, str], summary: dict, edges, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    centres = (edges[:-1] + edges[1:]) / 2
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.6), sharey=True)
    for ax, agent in zip(axes, AGENTS, strict=True):
        for name in names:
            curve = summary[name]["per_agent"][agent]
            mean, half = np.array(curve["mean"]), np.nan_to_num(np.array(curve["ci95"]))
            ax.plot(centres, mean, label=name)
            ax.fill_between(centres, mean - half, mean + half, alpha=0.2)
        ax.set_title(agent)
        ax.set_xlabel("env steps")
        ax.xaxis.set_major_formatter(lambda x, _: f"{x / 1000:.0f}k")
    axes[0].set_ylabel("mean episode return (95% CI)")
    axes[0].legend(fontsize=8)
    fig.suptitle(experiment.replace("_", " "))
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def train_variants(args, root: Path) -> dict[str, list[dict]]:
    names = [n for n in VARIANTS if any(n in pair for pair in EXPERIMENTS.values())]
    runs: dict[str, list[dict]] = {}
    for name in names:
        for seed in range(args.seeds):
            start = time.perf_counter()
            runs.setdefault(name, []).append(train_variant(name, seed, args.steps, root))
            got = runs[name][-1]["rates"]["low"]
            print(f"{name}, seed {seed}: {time.perf_counter() - start:.0f} s, completion "
                  f"{got['completion_rate']:.2f} at low traffic", flush=True)  # fmt: skip
    return runs


def experiments(args) -> dict:
    root = Path(tempfile.mkdtemp(prefix="intersection-experiments-"))
    if args.from_experiment is not None:
        runs = read_variants(args.from_experiment)
        args.steps = max(run["budget"] for r in runs.values() for run in r)
        args.seeds = min(len(r) for r in runs.values())
    else:
        runs = train_variants(args, root)
    edges = np.linspace(0, args.steps, 16)
    summary = {name: summarize_variant(r, edges) for name, r in runs.items()}
    args.results.mkdir(parents=True, exist_ok=True)
    for experiment, pair in EXPERIMENTS.items():
        if not all(name in summary for name in pair):
            print(f"\n{experiment}: not every variant has finished runs; skipped")
            continue
        plot(experiment, pair, summary, edges, args.results / f"intersection_{experiment}.png")
        print(f"\n{experiment}:")
        for name in pair:
            s = summary[name]
            finals = ", ".join(f"{a} {s['per_agent'][a]['final'][0]:.1f}" for a in AGENTS)
            print(
                f"  {name:<24} final returns {finals}; train {s['train_s'][0]:.0f} s; "
                f"falls of the team curve {s['drops'][0]:.1f} +- {s['drops'][1]:.1f}"
            )
            for traffic in ("low", "high"):
                c, x = (s["rates"][traffic][k] for k in ("completion_rate", "collision_rate"))
                print(f"    {traffic:>4} traffic: completion {c[0]:.2f} +- {c[1]:.2f}, "
                      f"collision {x[0]:.2f} +- {x[1]:.2f}")  # fmt: skip
    ratio = None
    if "MAPPO (shared weights)" in summary and "MADDPG" in summary:
        ratio = summary["MAPPO (shared weights)"]["train_s"][0] / summary["MADDPG"]["train_s"][0]
        print(f"\nwall-clock MAPPO / MADDPG at {args.steps:,} env steps: {ratio:.2f}")
    shutil.rmtree(root, ignore_errors=True)
    return {"steps": args.steps, "seeds": args.seeds, "bins": edges.tolist(),
            "summary": summary, "mappo_over_maddpg_wall_clock": ratio, "met": True}  # fmt: skip


def training_seconds(run_dir: Path) -> float:
    """A run's training wall-clock: its iterations' times (``perf/iteration_s``) summed."""
    rows = map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
    return sum(float(row.get("perf/iteration_s", 0.0)) for row in rows)


def wall_clock(args) -> dict:
    root = Path(tempfile.mkdtemp(prefix="intersection-wall-clock-"))
    names = list(VARIANTS)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(args.repeats):
        for name in names if round_ % 2 == 0 else names[::-1]:
            run_dir = root / f"{VARIANTS[name]}-{round_}"
            subprocess.run(
                [sys.executable, "-m", "shoal.cli", "train", "--tuned", VARIANTS[name],
                 "--run.total-steps", str(args.steps), "--run.eval-every-steps", "0",
                 "--run.seed", str(round_), "--run.run-dir", str(run_dir),
                 "--run.no-console", "--run.no-tensorboard"],
                check=True, capture_output=True,
            )  # fmt: skip
            seconds[name].append(training_seconds(run_dir))
            shutil.rmtree(run_dir, ignore_errors=True)
            print(f"round {round_}, {name}: {seconds[name][-1]:.0f} s", flush=True)
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    ratios = {name: medians[name] / medians["MADDPG"] for name in names}
    print(f"\ntraining wall-clock at {args.steps:,} env steps, median of {args.repeats}:")
    for name in names:
        print(f"  {name:<24} {medians[name]:7.0f} s   {ratios[name]:.2f} x MADDPG")
    shutil.rmtree(root, ignore_errors=True)
    return {"steps": args.steps, "repeats": args.repeats, "seconds": seconds,
            "median_s": medians, "over_maddpg": ratios, "met": True}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--speed", action="store_true", help="simulation speed")
    parser.add_argument("--validate", action="store_true", help="built-in against SUMO")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0, help="length of a timed block")
    parser.add_argument("--episodes", type=int, default=800)
    parser.add_argument("--highway-python", help="a Python with highway-env installed")
    parser.add_argument("--experiments", action="store_true", help="the paper's four")
    parser.add_argument(
        "--wall-clock", action="store_true", help="the variants' training times, in one sitting"
    )
    parser.add_argument(
        "--from-experiment", type=Path, help="read --experiments' runs from this directory"
    )
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=150_000, help="env steps per run")
    parser.add_argument("--results", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if not (args.speed or args.validate or args.experiments or args.wall_clock):
        args.speed = True
    set_compute_threads(1)
    results = {}
    if args.speed:
        results["speed"] = speed(args)
    if args.validate:
        results["validate"] = validate(args)
    if args.experiments:
        results["experiments"] = experiments(args)
    if args.wall_clock:
        results["wall_clock"] = wall_clock(args)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0 if all(r["met"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
