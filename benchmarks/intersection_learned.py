"""Do the agents learn the intersection? Final policies of trained runs (those of
``experiments/intersection_mappo.yaml``: the ``mappo-intersection`` tuned example, one run per
seed; or MADDPG's of ``experiments/biswas_intersection.yaml``) against the scripted drivers of
`shoal.envs.heuristics`, on the same first episodes of ``--episodes`` evaluation envs (seed
2024) at low and high traffic, random routes.

Each policy's rates are the deterministic ones (its most likely action), over ``--episodes``
episodes per seed: completion, collision, the mean time the completing agents took, and how
often it chose each of the four actions (keep lane, slow down, change right, change left),
counted over every agent row it acted for until the last env's first episode ended, finished
agents' rows included: a policy that never slows down cannot yield. The
scripted drivers are measured on the same episodes both at the trained policies' decision
rate (``decision_steps`` of their config) and every 0.1 s.

A run's rates are measured once: they are kept in the run directory's
``learned_<episodes>_episodes_seed_<seed>.json`` (which `benchmarks/archive_experiment.py`
keeps with the run, its checkpoints gone).

``--plot`` draws the runs' training curves (completion and collision rates of the training
episodes, sampled actions, in bins of 20k decisions: mean over runs with a 95% t interval).

Usage: ``python benchmarks/intersection_learned.py RUN [RUN ...] [--episodes 100]
[--json out.json] [--plot curves.png]``, e.g. ``python benchmarks/intersection_learned.py
runs/experiments/intersection-mappo/mappo-s*``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from scipy import stats

import shoal
from shoal.collect.evaluate import evaluate, evaluate_joint
from shoal.config import EnvConfig, replace
from shoal.envs.heuristics import IntersectionHeuristic, TimeToConflictDriver
from shoal.envs.intersection.observations import OBS_DIM
from shoal.envs.make import make_multi_agent_env
from shoal.nn.policy import JointPolicy


class Scripted:
    """A scripted driver as a policy on rows of agents (the plain env's observations)."""

    def __init__(self, driver, env):
        self.driver = driver(env.observation_space, env.action_space)

    def act(self, obs, deterministic=True):
        return self.driver.act(np.asarray(obs)[..., :OBS_DIM])


ACTIONS = ("keep", "slow", "right", "left")


class Counting:
    """A policy that counts the actions it returns (rows of agents, or MADDPG's joint dict)."""

    def __init__(self, policy):
        self.policy = policy
        self.counts = np.zeros(len(ACTIONS))

    def act(self, obs, **kwargs):
        actions = self.policy.act(obs, **kwargs)
        chosen = np.concatenate(
            [np.ravel(a) for a in actions.values()]
            if isinstance(actions, dict)
            else [np.ravel(actions)]
        )
        np.add.at(self.counts, chosen.astype(np.int64), 1)
        return actions

    def shares(self) -> dict[str, float]:
        total = max(self.counts.sum(), 1.0)
        return {
            f"action_{name}": float(c / total) for name, c in zip(ACTIONS, self.counts, strict=True)
        }


def rates(metrics: dict[str, float]) -> dict[str, float]:
    keys = ("completion_rate", "collision_rate", "off_road_rate", "time_to_complete")
    return {key: float(metrics[f"eval/{key}"]) for key in keys}


def plot(runs: list[str], path: str, bin_steps: int = 20_000) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = {"completion_rate": [], "collision_rate": []}
    for run in runs:
        rows = [json.loads(line) for line in (Path(run) / "metrics.jsonl").read_text().splitlines()]
        for key, runs_curves in curves.items():
            points = [(r["step"], r[f"episode/{key}"], r.get("episode/count", 1))
                      for r in rows if f"episode/{key}" in r]  # fmt: skip
            steps, values, episodes = np.array(points, dtype=float).T
            bins = (steps // bin_steps).astype(np.int64)  # rates over the episodes of a bin
            runs_curves.append([np.average(values[bins == b], weights=episodes[bins == b])
                                for b in range(bins.max())])  # fmt: skip
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, (key, runs_curves) in zip(axes, curves.items(), strict=True):
        n = min(len(c) for c in runs_curves)
        y = np.array([c[:n] for c in runs_curves])
        x = (np.arange(n) + 0.5) * bin_steps
        mean = y.mean(0)
        half = stats.t.ppf(0.975, len(y) - 1) * y.std(0, ddof=1) / np.sqrt(len(y))
        ax.plot(x, mean, label=f"{len(y)} runs")
        ax.fill_between(x, mean - half, mean + half, alpha=0.25)
        ax.set_xlabel("decisions (0.5 s each)")
        ax.set_ylabel(key.replace("_", " ") + " (training, sampled)")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+")
    parser.add_argument("--episodes", type=int, default=100)
    parser.add_argument("--seed", type=int, default=2024)
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--plot", help="draw the training curves here (PNG)")
    args = parser.parse_args(argv)
    if args.plot:
        plot(args.runs, args.plot)
    results = []
    for traffic in ("low", "high"):
        decision_steps = None
        for run in args.runs:
            cached = Path(run) / f"learned_{args.episodes}_episodes_seed_{args.seed}.json"
            held = json.loads(cached.read_text()) if cached.exists() else {}
            if traffic in held:  # measured once, kept with the run (see the docstring)
                decision_steps = held[traffic]["decision_steps"]
                results.append(held[traffic])
                print(json.dumps(held[traffic]))
                continue
            policy = shoal.load(run)
            config = policy.config.env
            decision_steps = int(config.kwargs.get("decision_steps", 1))
            config = replace(
                config, num_envs=args.episodes, kwargs={**config.kwargs, "traffic": traffic}
            )
            joint = isinstance(policy, JointPolicy)  # MADDPG's agents, or rows of agents
            env = (make_multi_agent_env if joint else shoal.make_env)(config)
            counting = Counting(policy)
            metrics = (evaluate_joint if joint else evaluate)(counting, env, args.seed)
            env.close()
            row = {"policy": Path(run).name, "traffic": traffic, "decision_steps": decision_steps}
            row.update(rates(metrics))
            row.update(counting.shares())
            results.append(row)
            print(json.dumps(row))
            cached.write_text(json.dumps({**held, traffic: row}, indent=2))
        for steps in sorted({1, decision_steps or 1}):
            plain = EnvConfig(
                id="shoal/intersection-v0",
                num_envs=args.episodes,
                kwargs={"traffic": traffic, "decision_steps": steps},
            )
            for name, driver in (
                ("time-to-conflict", TimeToConflictDriver),
                ("cone", IntersectionHeuristic),
            ):
                env = shoal.make_env(plain)
                row = {"policy": name, "traffic": traffic, "decision_steps": steps}
                counting = Counting(Scripted(driver, env))
                row.update(rates(evaluate(counting, env, args.seed)))
                row.update(counting.shares())
                env.close()
                results.append(row)
                print(json.dumps(row))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
