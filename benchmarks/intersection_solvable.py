"""Is ``shoal/intersection-v0`` solvable with its actions, observations and time limit? Four
scripted drivers over the same episodes: a privileged one (it reads the simulator's state:
every vehicle's position, heading, speed and route) that yields by time to conflict;
`shoal.envs.heuristics.TimeToConflictDriver`, the same rule from the agents' vector
observations alone (it extrapolates the neighbours at their observed velocity); the
keep-lane-and-yield cone of `shoal.envs.heuristics.IntersectionHeuristic`; and keeping the
lane blindly.

The privileged driver keeps its lane (action 0) unless a conflict is predicted, then slows
down (action 1): every ``dt_check`` seconds up to ``horizon`` seconds ahead it places itself
along its own route at cruising speed (``s + v t``) and every other vehicle along its own
route (agents and background vehicles alike: `point_at` on their routes at their speeds); a
conflict is any pair of positions closer than ``clearance`` metres at the same time. The
question it answers is the one of issue 41: can any policy with these actions complete >= 0.9
of routes at low traffic within the 30 s limit?

Usage: ``python benchmarks/intersection_solvable.py [--episodes 100] [--traffic low high]
[--decision-steps 1 5] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from shoal.envs.heuristics import IntersectionHeuristic, TimeToConflictDriver
from shoal.envs.intersection.env import IntersectionEnv
from shoal.envs.intersection.geometry import point_at
from shoal.envs.intersection.scenario import AGENTS, GROUP


def privileged_actions(
    env: IntersectionEnv, horizon: float = 3.0, dt_check: float = 0.25, clearance: float = 3.0
) -> np.ndarray:
    """``[B, 4]`` actions of the time-to-conflict driver (see the module docstring)."""
    v, sc = env.vehicles, env.scenario
    routes = sc.routes
    B, V = v.present.shape
    actions = np.zeros((B, AGENTS), np.int64)
    times = np.arange(dt_check, horizon + 1e-9, dt_check)
    lengths = routes.length
    for b in range(B):
        others = np.flatnonzero(v.present[b])
        for a in range(AGENTS):
            if not v.present[b, a]:
                continue
            route = v.route[b, a]
            s0 = v.s[b, a]
            if s0 + 1.0 >= lengths[route]:
                continue
            mine_s = s0 + sc.target_speed * times
            mine, _ = point_at(routes, np.full(len(times), route), mine_s)
            conflict = False
            for o in others:
                if o == a:
                    continue
                o_s = v.s[b, o] + v.speed[b, o] * times
                theirs, _ = point_at(routes, np.full(len(times), v.route[b, o]), o_s)
                close = np.linalg.norm(mine - theirs, axis=1) < clearance
                # Only conflicts ahead of us: the other is not the car following us.
                ahead = (theirs - v.pos[b, a]) @ np.array(
                    [np.cos(v.heading[b, a]), np.sin(v.heading[b, a])]
                )
                if (close & (ahead > -1.0)).any():
                    # Give way to whoever is closer to the meeting point; the nearer one goes.
                    first = int(np.argmax(close))
                    mine_to = np.linalg.norm(mine[first] - v.pos[b, a])
                    theirs_to = np.linalg.norm(theirs[first] - v.pos[b, o])
                    if mine_to >= theirs_to - 0.5:
                        conflict = True
                        break
            actions[b, a] = 1 if conflict else 0
    return actions


def run(
    policy: str, episodes: int, traffic: str, seed: int, decision_steps: int = 1, envs: int = 10
) -> dict[str, float]:
    env = IntersectionEnv(envs, traffic=traffic, seed=seed, decision_steps=decision_steps)
    group = env.groups[GROUP]
    scripted = {"heuristic": IntersectionHeuristic, "time-to-conflict": TimeToConflictDriver}
    driver = (
        scripted[policy](group.observation_space, group.action_space)
        if policy in scripted
        else None
    )
    obs, _ = env.reset(seed=seed)
    completion, collision, off_road, times = [], [], [], []
    start = time.perf_counter()
    while len(completion) < episodes:
        if policy == "privileged":
            actions = privileged_actions(env)
        elif policy == "keep-lane":
            actions = np.zeros((envs, AGENTS), np.int64)
        else:
            actions = driver.act(obs[GROUP])
        step = env.step({GROUP: actions})
        obs = step.obs
        if step.episode_info is not None:
            info = step.episode_info
            completion += list(info["completion_rate"])
            collision += list(info["collision_rate"])
            off_road += list(info.get("off_road_rate", np.zeros(len(info["completion_rate"]))))
            times += list(info["time_to_complete"])
    env.close()
    n = episodes
    return {
        "policy": policy,
        "traffic": traffic,
        "decision_steps": decision_steps,
        "episodes": n,
        "completion": float(np.mean(completion[:n])),
        "collision": float(np.mean(collision[:n])),
        "off_road": float(np.mean(off_road[:n])),
        "time_to_complete_s": float(np.nanmean(times[:n])),
        "wall_s": time.perf_counter() - start,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=100)
    parser.add_argument("--traffic", nargs="+", default=["low", "high"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--decision-steps", type=int, nargs="+", default=[1, 5])
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    results = [
        run(policy, args.episodes, traffic, args.seed, decision_steps)
        for decision_steps in args.decision_steps
        for traffic in args.traffic
        for policy in ("privileged", "time-to-conflict", "heuristic", "keep-lane")
    ]
    for result in results:
        print(json.dumps(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
