"""``shoal eval``: a trained run's policy on episodes of its env (or a game's matches),
its statistics with confidence intervals, a video."""

from __future__ import annotations

import argparse
import functools
import json
import os
from pathlib import Path
from typing import Any

import yaml

from shoal.cli.shared import add_trust_code, console, plain
from shoal.core.errors import ShoalError


def add_parser(commands: Any) -> None:
    parser = commands.add_parser("eval", help="evaluate a trained run")
    parser.add_argument("run_dir", help="run directory or checkpoint directory")
    parser.add_argument("--episodes", type=int, default=10, help="evaluation episodes")
    parser.add_argument("--seed", type=int, default=12345, help="seed of the evaluation envs")
    parser.add_argument("--video", help="also record one episode to this .gif or .mp4")
    actions = parser.add_mutually_exclusive_group()
    actions.add_argument(
        "--actions",
        choices=("deterministic", "sampled"),
        help="greedy actions or actions sampled from the policy (default: the run's "
        "run.eval_actions, as its training evaluations acted)",
    )
    actions.add_argument(
        "--stochastic", dest="actions", action="store_const", const="sampled",
        help="sample actions (--actions sampled)",
    )  # fmt: skip
    add_trust_code(parser)
    parser.add_argument(
        "--json",
        nargs="?",
        const="-",
        metavar="FILE",
        help="write the statistics as JSON to FILE (or, alone, print them as JSON)",
    )
    parser.add_argument(
        "--fixed",
        nargs=2,
        action="append",
        metavar=("GROUP", "POLICY"),
        default=[],
        help="multi-agent envs: let GROUP (or one agent, a seat) act by a fixed POLICY (random, "
        "module:Class, run:PATH: another run or checkpoint, pool:ID: a snapshot of the run's "
        "self-play pool) instead of its trained one (or the run's env.opponents); repeatable",
    )
    parser.add_argument(
        "--env.kwargs",
        dest="env_kwargs",
        nargs="+",
        action="extend",
        default=[],
        metavar="NAME VALUE",
        help="env options over the run's own, as shoal train takes them (e.g. backend sumo "
        "traffic high)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from shoal.api import check_episodes, load, plays_a_game, use_run_threads
    from shoal.studies.evaluation import Evaluation
    from shoal.train.checkpoint import load_checkpoint
    from shoal.train.progress import Countdown
    from shoal.train.video import record_video

    try:
        check_episodes(args.episodes)
    except ShoalError:
        raise ShoalError(f"--episodes must be >= 1, not {args.episodes}") from None
    checkpoint = load_checkpoint(args.run_dir, trust_code=args.trust_code)
    use_run_threads(checkpoint)
    if plays_a_game(checkpoint):  # matches against fixed players, not episodes of an env
        return _eval_matches(args, checkpoint)
    fixed = dict(args.fixed)
    pools = any(spec.startswith("pool:") for spec in fixed.values())
    loader = functools.partial(load, trust_code=args.trust_code)
    evaluation = Evaluation(
        loader(args.run_dir), fixed, _env_kwargs(args.env_kwargs), loader=loader,
        checkpoint=checkpoint if pools else None,
    )  # fmt: skip
    deterministic = None if args.actions is None else args.actions == "deterministic"
    with Countdown(args.episodes, "episodes") as tick:
        report = evaluation.statistics(args.episodes, args.seed, deterministic, tick)
    if _write_report(args, report):
        return 0
    for line in _eval_lines(report, report["env"], args.episodes):
        plain(line)
    if args.video:
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # render off-screen, no display
        video_env = evaluation.make_env(1, render_mode="rgb_array")
        try:
            policy = evaluation.playing(video_env)
            video = record_video(policy, video_env, Path(args.video), args.seed)
        except ImportError as exc:
            raise ShoalError(f"rendering needs an extra package: {exc}") from exc
        finally:
            video_env.close()
        console.print(f"video: {video.describe()}", highlight=False)
    return 0


def _eval_matches(args: argparse.Namespace, checkpoint: Any) -> int:
    """``shoal eval`` of a run that plays a two-player game: its search against a random and
    a minimax player, ``--episodes`` games each (half of them first)."""
    from shoal.api import game_report
    from shoal.train.progress import Countdown

    unused = [flag for flag, given in (("--fixed", args.fixed), ("--video", args.video),
                                       ("--actions", args.actions),
                                       ("--env.kwargs", args.env_kwargs)) if given]  # fmt: skip
    if unused:
        raise ShoalError(
            f"{', '.join(unused)}: a run that plays a two-player game is evaluated by matches "
            "of its search against a random and a minimax player, which take none of these"
        )
    with Countdown(2 * args.episodes, "games") as tick:
        report = game_report(checkpoint, args.episodes, args.seed, tick)
    if _write_report(args, report):
        return 0
    plain(f"{args.episodes} games each on {report['env']}, the search "
          f"({report['simulations']} simulations) with the trained network:")  # fmt: skip
    for name, result in report["opponents"].items():
        plain(f"  vs {name}: {result['wins']} wins, {result['draws']} draws, "
              f"{result['losses']} losses (score {100 * result['score']:.1f}%)")  # fmt: skip
    return 0


def _write_report(args: argparse.Namespace, report: dict[str, Any]) -> bool:
    """Add the run to ``report`` and write it as ``--json`` asks; True when it was printed
    (``--json`` alone), which is then all ``shoal eval`` prints."""
    report["run"] = str(args.run_dir)
    text = json.dumps(report, indent=2)
    if args.json == "-":
        print(text)
        return True
    if args.json:
        Path(args.json).write_text(text + "\n")
    return False


def _env_kwargs(words: list[str]) -> dict[str, Any]:
    """``--env.kwargs NAME VALUE ...`` (as ``shoal train`` takes them): the env's options,
    values read as YAML scalars."""
    if len(words) % 2:
        raise ShoalError(f"--env.kwargs takes NAME VALUE pairs, not {' '.join(words)!r}")
    return {
        name: yaml.safe_load(value) for name, value in zip(words[::2], words[1::2], strict=True)
    }


def _eval_lines(report: dict[str, Any], env_id: str, episodes: int) -> list[str]:
    """`shoal eval`'s summary: the return with its interval over episodes (or each group's,
    where groups oppose), each agent's, a game's win / draw / loss rates, the env's own
    statistics."""

    def stats(s: dict[str, float]) -> str:
        return f"{s['mean']:.2f} [{s['ci_low']:.2f}, {s['ci_high']:.2f}]"

    lines = []
    if not report["deterministic"]:  # greedy actions are the default; sampled ones are said
        env_id = f"{env_id} (sampled actions)"
    players = report["players"]
    if players and (len(players) > 1 or "trained" not in players.values()):
        each = ", ".join(f"{k} {v}" for k, v in players.items())
        lines.append(f"players: {each}")
    length = report["length"]["mean"]
    if "return" in report:
        r = report["return"]
        lines.append(
            f"{episodes} episodes on {env_id}: return {r['mean']:.2f} ± {r['std']:.2f} (95% CI "
            f"{r['ci_low']:.2f} to {r['ci_high']:.2f}; median {r['median']:.2f}, min "
            f"{r['min']:.2f}, max {r['max']:.2f}), length {length:.1f}"
        )
    elif len(report["groups"]) > 1:
        groups = ", ".join(f"{g} {stats(s)}" for g, s in report["groups"].items())
        lines.append(
            f"{episodes} episodes on {env_id}, length {length:.1f}: return per group (mean over "
            f"its agents, 95% CI over episodes): {groups}"
        )
    else:  # one group whose seats play each other
        lines.append(f"{episodes} games on {env_id}, length {length:.1f}")
    if 1 < len(report["agents"]) <= 12:
        each = ", ".join(f"{a} {stats(s)}" for a, s in report["agents"].items())
        lines.append(f"return per agent (95% CI): {each}")
    for name, rates in report["outcomes"].items():
        each = ", ".join(
            f"{word} {r['rate']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}]"
            for word, r in rates.items()
        )
        lines.append(f"{name}: {each}")
    if report["env_statistics"]:  # a traffic env's collision rate, ...
        each = ", ".join(f"{k} {v:.3f}" for k, v in report["env_statistics"].items())
        lines.append(f"episode statistics: {each}")
    return lines
