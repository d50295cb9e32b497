"""``shoal export`` and ``shoal collect``: what is made from a trained run, a standalone
policy file or a dataset of its episodes."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from shoal.cli.shared import add_trust_code, console
from shoal.core.errors import ShoalError


def add_parsers(commands: Any) -> None:
    export_p = commands.add_parser(
        "export", help="write a run's policy as a standalone ONNX or TorchScript file"
    )
    export_p.add_argument("run_dir", help="run directory or checkpoint directory")
    add_trust_code(export_p)
    export_p.add_argument("--format", choices=["onnx", "torchscript"], default="onnx")
    export_p.add_argument(
        "--output", help="file to write (default: RUN/policy.onnx or RUN/policy.pt)"
    )
    export_p.set_defaults(run=_export)
    collect_p = commands.add_parser(
        "collect", help="record a policy's episodes (or a run's replay) as a Minari dataset"
    )
    collect_p.add_argument("run_dir", nargs="?", help="the run whose policy acts (omit: random)")
    collect_p.add_argument("--out", help="the new dataset directory (--recipe: datasets/NAME)")
    collect_p.add_argument(
        "--recipe", help="make a tuned example's dataset: train its source run, then collect "
        "(pendulum-medium, halfcheetah-medium-replay, ...; shoal list --datasets)",
    )  # fmt: skip
    collect_p.add_argument(
        "--runs", default="runs/datasets", help="--recipe: where its source runs are kept"
    )
    collect_p.add_argument("--episodes", type=int, default=100, help="episodes to record")
    collect_p.add_argument("--env", help="env id (random policy; or another env for the run)")
    collect_p.add_argument(
        "--noise", type=float, default=0.0,
        help="Gaussian noise on continuous actions, std in half action ranges (medium data)",
    )  # fmt: skip
    collect_p.add_argument(
        "--epsilon", type=float, default=0.0,
        help="probability of a uniformly random action per step (mixed-quality data)",
    )  # fmt: skip
    collect_p.add_argument("--stochastic", action="store_true", help="sample the run's actions")
    collect_p.add_argument(
        "--from-replay", action="store_true",
        help="export the replay buffer the run saved (--replay.save) instead of acting",
    )  # fmt: skip
    collect_p.add_argument(
        "--expert", help="the run whose mean return is the dataset's 100 (default: RUN)"
    )
    collect_p.add_argument(
        "--ref-episodes", type=int, default=10,
        help="episodes of the random and expert policies behind the reference scores",
    )  # fmt: skip
    collect_p.add_argument(
        "--ref-max-score", type=float, help="the expert's return, stated (instead of --expert)"
    )
    collect_p.add_argument("--num-envs", type=int, default=8, help="envs stepped in parallel")
    collect_p.add_argument("--seed", type=int, default=0, help="seed of the envs and noise")
    add_trust_code(collect_p)
    collect_p.set_defaults(run=_collect)


def _export(args: argparse.Namespace) -> int:
    from shoal.api import load
    from shoal.nn.policy import ActorPolicy
    from shoal.studies.export import SUFFIX, export, has_mask

    policy = load(args.run_dir, trust_code=args.trust_code)
    run_dir = Path(args.run_dir)
    output = args.output or (run_dir if run_dir.is_dir() else run_dir.parent) / (
        "policy" + SUFFIX[args.format]
    )
    files = export(policy, output, args.format)
    masked = isinstance(policy, ActorPolicy) and policy.takes_mask and has_mask(policy)
    for path in files:
        console.print(
            f"exported: {path} ({args.format}; its actions equal shoal.load(RUN).act's on "
            "batches of 64, 1 and 3 "
            + ("observations with legal-action masks; inputs obs and action_mask)" if masked
               else "observations)"),
            highlight=False,
        )  # fmt: skip
    return 0


def _collect(args: argparse.Namespace) -> int:
    from shoal.data.offline import read_dataset
    from shoal.studies.datasets import collect, make_dataset
    from shoal.train.progress import Countdown

    for name in ("episodes", "ref_episodes", "num_envs"):
        if getattr(args, name) < 1:
            raise ShoalError(f"--{name.replace('_', '-')} must be >= 1")
    if args.noise < 0 or not 0 <= args.epsilon <= 1:
        raise ShoalError("--noise must be >= 0 and --epsilon in [0, 1]")
    if args.recipe:
        path = make_dataset(args.recipe, args.out, args.runs, countdown=Countdown)
    elif args.out is None:
        raise ShoalError("name the new dataset's directory: --out DIR")
    else:
        path = collect(
            args.out, args.run_dir, episodes=args.episodes, env=args.env, noise=args.noise,
            epsilon=args.epsilon, stochastic=args.stochastic, from_replay=args.from_replay,
            expert=args.expert, ref_episodes=args.ref_episodes,
            ref_max_score=args.ref_max_score, num_envs=args.num_envs, seed=args.seed,
            trust_code=args.trust_code, countdown=Countdown,
        )  # fmt: skip
    data = read_dataset(path)
    returns = data.returns()
    line = (f"wrote {path}: {len(returns)} episodes, {data.num_steps:,} steps of "
            f"{data.env_id}, mean return {returns.mean():.1f}")  # fmt: skip
    score = data.normalized_score(float(returns.mean()))
    if score is not None:
        line += (f" (normalized {score:.1f}: random {data.ref_min_score:.1f}, expert "
                 f"{data.ref_max_score:.1f})")  # fmt: skip
    console.print(line, highlight=False)
    return 0
