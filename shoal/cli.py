"""The ``shoal`` command line: train, eval, list.

``shoal train ppo --env CartPole-v1 --num-epochs 2``: options after the algorithm name are the
fields of its config dataclass (nested blocks with a dot: ``--run.seed 3``, ``--env.num-envs
16``), parsed by tyro from the same dataclasses that the YAML tuned examples fill in.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import sys
import textwrap
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.markup import escape
from rich.table import Column, Table

from shoal.errors import ShoalError

# Short flags for the most used fields, translated to their dotted tyro names.
SHORTHANDS = {
    "--env": "--env.id",
    "--seed": "--run.seed",
    "--total-steps": "--run.total-steps",
    "--run-dir": "--run.run-dir",
    "--target-return": "--run.target-return",
    "--num-envs": "--env.num-envs",
    "--runners": "--run.runners",
    "--ray-address": "--run.ray-address",
}

TRAIN_HELP = """\
usage: shoal train ALGO [--FIELD VALUE ...]
       shoal train --tuned NAME [--FIELD VALUE ...]
       shoal train --config FILE.yaml [--FIELD VALUE ...]
       shoal train --resume RUN_DIR [--FIELD VALUE ...]

Train an agent and save its run (logs, checkpoints, config) under runs/.

  ALGO              an algorithm: ppo, dqn, sac, ... (shoal list)
  --tuned NAME      a tuned example (shoal list shows them with their envs)
  --config FILE     a YAML file in the tuned-example format
  --resume RUN_DIR  continue a run exactly where its last checkpoint left it
  --trust-code      with --resume: import users' modules from the directories the run
                    records (only for runs whose code you trust)
  --FIELD VALUE     any config field, nested with dots: --env CartPole-v1,
                    --run.total-steps 200000, --optim.lr 3e-4, --model.hidden 64 64
                    (shorthands: --env, --seed, --total-steps, --run-dir,
                    --target-return, --num-envs, --runners, --ray-address)

shoal train ALGO --help lists every field of ALGO's config with its default and meaning.

examples:
  shoal train ppo --env CartPole-v1
  shoal train --tuned sac-pendulum --seed 3
  shoal train --resume runs/ppo-CartPole-v1-... --run.total-steps 500000
  shoal train ppo --env CartPole-v1 --env.frame-stack 4
  shoal train ppo --env CartPole-v1 --model.encoder mynets:Wide       # your nn.Module
  shoal train ppo --env CartPole-v1 --run.callbacks "EarlyStopping(patience=5)" SaveBest"""

EXIT_INTERRUPTED = 130  # the shell's code for a command stopped by Ctrl-C

console = Console(soft_wrap=True)  # never break paths across lines


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="shoal", description="Reinforcement learning on PyTorch.")
    parser.add_argument("--version", action="version", version=f"shoal {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("train", help="train an agent (shoal train ALGO --help)")
    eval_p = commands.add_parser("eval", help="evaluate a trained run")
    eval_p.add_argument("run_dir", help="run directory or checkpoint directory")
    eval_p.add_argument("--episodes", type=int, default=10, help="evaluation episodes")
    eval_p.add_argument("--seed", type=int, default=12345, help="seed of the evaluation envs")
    eval_p.add_argument("--video", help="also record one episode to this .gif or .mp4")
    eval_p.add_argument("--stochastic", action="store_true", help="sample actions")
    eval_p.add_argument(
        "--trust-code",
        action="store_true",
        help="import users' modules from the directories the run records (only for runs whose "
        "code you trust; without it, only installed packages and the working directory)",
    )
    eval_p.add_argument(
        "--json",
        nargs="?",
        const="-",
        metavar="FILE",
        help="write the statistics as JSON to FILE (or, alone, print them as JSON)",
    )
    eval_p.add_argument(
        "--fixed",
        nargs=2,
        action="append",
        metavar=("GROUP", "POLICY"),
        default=[],
        help="multi-agent envs: let GROUP (or one agent, a seat) act by a fixed POLICY (random, "
        "module:Class, run:PATH: another run or checkpoint, pool:ID: a snapshot of the run's "
        "self-play pool) instead of its trained one (or the run's env.opponents); repeatable",
    )
    eval_p.add_argument(
        "--env.kwargs",
        dest="env_kwargs",
        nargs="+",
        action="extend",
        default=[],
        metavar="NAME VALUE",
        help="env options over the run's own, as shoal train takes them (e.g. backend sumo "
        "traffic high)",
    )
    experiment_p = commands.add_parser(
        "experiment", help="a grid of configs x seeds, run in parallel (resumable)"
    )
    experiment_p.add_argument("file", help="the experiment's YAML file")
    experiment_p.add_argument("--dir", help="experiment directory (default runs/experiments/NAME)")
    experiment_p.add_argument("--jobs", type=int, help="runs at a time (default: the cores)")
    experiment_p.add_argument("--plan", action="store_true", help="list the runs, run nothing")
    experiment_p.add_argument(
        "--retries", type=int, default=2,
        help="start a run that crashed again (from its checkpoint) up to this many times",
    )  # fmt: skip
    experiment_p.add_argument(
        "--ray-address",
        help="run each run as a Ray task: 'auto' or HOST:PORT joins a cluster (the directory "
        "must be shared storage), 'local' starts a Ray here",
    )
    tune_p = commands.add_parser("tune", help="hyperparameter search with Optuna (resumable)")
    tune_p.add_argument("file", help="the search's YAML file")
    tune_p.add_argument("--dir", help="study directory (default runs/tune/NAME)")
    tune_p.add_argument(
        "--jobs", type=int, help="workers on the study (default 1; with --ray-address the CPUs)"
    )
    tune_p.add_argument(
        "--ray-address",
        help="run the workers as Ray tasks: 'auto' or HOST:PORT joins a cluster, 'local' "
        "starts a Ray here (the study must be reachable from every node: see --storage)",
    )
    tune_p.add_argument(
        "--storage",
        help="Optuna storage URL for the study (default sqlite in --dir; e.g. postgresql://"
        "user@host/db on a cluster)",
    )
    report_p = commands.add_parser(
        "report", help="aggregate runs by variant: scores with 95%% CIs, curves, comparisons"
    )
    report_p.add_argument("dir", help="an experiment directory, or a directory of runs")
    report_p.add_argument("--out", help="where to write (default DIR/report)")
    export_p = commands.add_parser(
        "export", help="write a run's policy as a standalone ONNX or TorchScript file"
    )
    export_p.add_argument("run_dir", help="run directory or checkpoint directory")
    export_p.add_argument(
        "--trust-code",
        action="store_true",
        help="import users' modules from the directories the run records (only for runs whose "
        "code you trust; without it, only installed packages and the working directory)",
    )
    export_p.add_argument("--format", choices=["onnx", "torchscript"], default="onnx")
    export_p.add_argument(
        "--output", help="file to write (default: RUN/policy.onnx or RUN/policy.pt)"
    )
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
    collect_p.add_argument(
        "--trust-code", action="store_true",
        help="import users' modules from the directories the runs record",
    )  # fmt: skip
    list_p = commands.add_parser("list", help="algorithms and tuned examples")
    list_p.add_argument(
        "--envs", action="store_true", help="environment ids that work here, grouped"
    )
    list_p.add_argument("--long", action="store_true", help="full descriptions")
    list_p.add_argument(
        "--datasets", action="store_true", help="dataset recipes (shoal collect --recipe NAME)"
    )

    try:
        if argv[:1] == ["train"]:
            return _train(*_split_train_args(argv[1:]))
        args = parser.parse_args(argv)
        if args.command == "eval":
            return _eval(args)
        if args.command == "export":
            return _export(args)
        if args.command == "experiment":
            return _experiment(args)
        if args.command == "report":
            return _report(args)
        if args.command == "tune":
            return _tune(args)
        if args.command == "collect":
            return _collect(args)
        return _list(args)
    except ShoalError as exc:
        console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
        return 2
    except KeyboardInterrupt:  # the second Ctrl-C: abort without saving
        # On a terminal the cursor stands after the echoed ^C: start a line of its own.
        console.print(("\n" if console.is_terminal else "") + "aborted", highlight=False)
        return EXIT_INTERRUPTED


def _collect(args: argparse.Namespace) -> int:
    from shoal.data.offline import read_dataset
    from shoal.datasets import collect, make_dataset

    for name in ("episodes", "ref_episodes", "num_envs"):
        if getattr(args, name) < 1:
            raise ShoalError(f"--{name.replace('_', '-')} must be >= 1")
    if args.noise < 0 or not 0 <= args.epsilon <= 1:
        raise ShoalError("--noise must be >= 0 and --epsilon in [0, 1]")
    if args.recipe:
        path = make_dataset(args.recipe, args.out, args.runs)
    elif args.out is None:
        raise ShoalError("name the new dataset's directory: --out DIR")
    else:
        path = collect(
            args.out, args.run_dir, episodes=args.episodes, env=args.env, noise=args.noise,
            epsilon=args.epsilon, stochastic=args.stochastic, from_replay=args.from_replay,
            expert=args.expert, ref_episodes=args.ref_episodes,
            ref_max_score=args.ref_max_score, num_envs=args.num_envs, seed=args.seed,
            trust_code=args.trust_code,
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


def _version() -> str:
    from shoal import __version__

    return __version__


def _split_train_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """Separate shoal's own train options from the config fields that go to tyro.

    argparse cannot do this split: it would take the value of an unknown ``--field value``
    for the positional algorithm name.
    """
    args = argparse.Namespace(
        algo=None, config=None, tuned=None, resume=None, help=False, trust_code=False
    )
    rest: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, value = arg.partition("=")
        if name in ("--config", "--tuned", "--resume"):
            if not eq:
                if i + 1 >= len(argv):
                    raise ShoalError(f"{name} needs a value")
                i, value = i + 1, argv[i + 1]
            setattr(args, name[2:], value)
        elif arg in ("-h", "--help"):
            args.help = True
        elif arg == "--trust-code":
            args.trust_code = True
        elif i == 0 and not arg.startswith("-"):
            args.algo = arg
        else:
            rest.append(arg)
        i += 1
    return args, rest


def _train(args: argparse.Namespace, rest: list[str]) -> int:
    from shoal.api import train

    built = train_config(args, rest)
    if built is None:
        return 0
    spec, config = built
    dataset = getattr(config, "dataset", "")
    where = f"the dataset {dataset}" if dataset else config.env.id
    console.print(f"training [bold]{spec.name}[/] on [bold]{where}[/]", highlight=False)
    result = train(config, resume=args.resume, trust_code=args.trust_code)
    _print_result(result)
    return EXIT_INTERRUPTED if result.stop_reason == "interrupted" else 0


def train_config(args: argparse.Namespace, rest: list[str]) -> tuple[Any, Any] | None:
    """The algorithm and the config ``shoal train`` would train with (`_split_train_args`'s
    split of its arguments), built and checked, nothing trained; None after printing the
    help. The docs' tests check every ``shoal train`` command of the site with it."""
    import tyro

    from shoal.config import from_dict
    from shoal.registry import find_tuned, get_algorithm
    from shoal.train.checkpoint import load_checkpoint

    if args.resume:
        checkpoint = load_checkpoint(args.resume, trust_code=args.trust_code, set_aside=True)
        spec = get_algorithm(checkpoint.meta["algo"])
        base: Any = from_dict(spec.config_cls, checkpoint.config)
    elif args.config or args.tuned:
        example = find_tuned(args.config or args.tuned)
        if args.algo and args.algo != example.algo:
            raise ShoalError(f"{example.name} configures {example.algo!r}, not {args.algo!r}")
        spec = get_algorithm(example.algo)
        base = example.build_config()
    elif args.algo:
        if args.algo == "iql" and any(a.split("=")[0] == "--dataset" for a in rest):
            raise ShoalError(
                "iql is independent Q-learning for teams of agents; implicit Q-learning on a "
                "dataset is iql-offline (shoal train iql-offline --dataset DIR)"
            )
        spec = get_algorithm(args.algo)
        base = spec.default_config()
    elif args.help:
        console.print(TRAIN_HELP, highlight=False, markup=False)
        return None
    else:
        raise ShoalError("name an algorithm (shoal train ppo), --tuned NAME, --config or --resume")
    rest = renamed_flags(spec.config_cls, [SHORTHANDS.get(a, a) for a in rest])
    rest = whole_numbers(spec.config_cls, rest)
    rest += ["--help"] if args.help else []
    config = tyro.cli(spec.config_cls, default=base, args=rest, prog=f"shoal train {spec.name}")
    return spec, config


_SCIENTIFIC = re.compile(r"^[0-9]+(\.[0-9]*)?[eE]\+?[0-9]+$")


def whole_numbers(cls: type, argv: list[str]) -> list[str]:
    """``argv`` with the values of integer fields written in scientific notation (``--run.
    total-steps 1e5``, as users write budgets) spelled as integers, which tyro requires;
    a value that is not a whole number is left for tyro to refuse."""
    out = list(argv)
    for i, arg in enumerate(argv[:-1]):
        value = argv[i + 1]
        flag = arg[2:].replace("-", "_").split(".")
        if arg.startswith("--") and _SCIENTIFIC.match(value) and _field_type(cls, flag) is int:
            number = float(value)
            out[i + 1] = str(int(number)) if number.is_integer() else value
    return out


def _field_type(cls: type, path: list[str]) -> Any:
    """The type of the (nested) dataclass field ``path`` of ``cls``, or None."""
    import dataclasses
    import typing

    for name in path:
        if not dataclasses.is_dataclass(cls):
            return None
        hints = typing.get_type_hints(cls)
        if name not in hints:
            return None
        cls = hints[name]
    return cls


def renamed_flags(cls: type, argv: list[str]) -> list[str]:
    """``argv`` with the flags of fields an earlier shoal version named otherwise
    (`shoal.config.Renamed`) and the values it named otherwise (``RENAMED_VALUES``) spelled as
    today: ``--buffer-size 5000`` becomes ``--replay.buffer-size 5000``, ``--replay uniform``
    ``--replay.prioritized none``, ``--env.atari ref001-stack`` ``--env.atari crop80-stack``."""
    from shoal.config import rename_key, renames

    out: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if not arg.startswith("--"):
            out.append(arg)
            continue
        flag, eq, value = arg[2:].partition("=")
        negated = flag.startswith("no-") and flag[3:].replace("-", "_") in renames(cls)
        flag = flag[3:] if negated else flag
        separate = not eq and not negated and i < len(argv) and not argv[i].startswith("--")
        if separate:
            value = argv[i]
        given = value if (eq or separate) else {}
        new, new_value = rename_key(cls, flag, given)
        if new == flag and new_value is given:
            out.append(arg)
            continue
        head, _, last = new.rpartition(".")  # tyro negates a boolean as --block.no-name
        new = f"{head}.no-{last}" if negated and head else ("no-" + new if negated else new)
        out.append("--" + new.replace("_", "-"))
        if eq or separate:
            out.append(str(new_value))
            i += 1 if separate else 0
    return out


def _print_result(result) -> None:
    console.print(
        f"stopped:     {result.stop_detail}\n"
        f"time:        {_times(result)}\n"
        f"eval return: {_eval_text(result)}\n"
        f"run:         {result.run_dir}\n"
        f"checkpoint:  {result.checkpoint}\n"
        f"evaluate:    shoal eval {result.run_dir}\n"
        f"tensorboard: tensorboard --logdir {result.run_dir / 'tb'}",
        highlight=False,
    )


def _times(result) -> str:
    """This process's wall-clock and training seconds, and the whole run's training seconds
    when it was resumed."""
    session_train = result.train_s if result.session_train_s is None else result.session_train_s
    text = f"{result.wall_s:.1f} s in this process, {session_train:.1f} s of it training"
    if result.resumed_from is not None:
        text += f"; {result.train_s:.1f} s training over the whole run"
    return text


def _eval_text(result) -> str:
    if result.eval_return is None:
        return "none (run.eval_every_steps is 0)"
    text = f"{result.eval_return:.1f}"
    if result.eval_step is not None:
        text += f" at env step {result.eval_step:,}"
        if result.eval_step != result.env_steps:
            text += f" (the run ended at {result.env_steps:,})"
    return text


def _experiment(args: argparse.Namespace) -> int:
    from rich.live import Live

    from shoal.experiment import plan, read_spec, run_experiment

    experiment = plan(read_spec(args.file), args.dir)
    console.print(
        f"experiment [bold]{escape(experiment.name)}[/]: {len(experiment.runs)} runs in "
        f"{experiment.directory}",
        highlight=False,
    )
    if args.plan:
        for run in experiment.runs:
            console.print(f"  {run.name}  ({run.algo}, seed {run.seed})", highlight=False)
        return 0

    def table(status: dict) -> Table:
        view = Table("run", "state", Column("env steps", justify="right"),
                     Column("wall", justify="right"))  # fmt: skip
        for run in experiment.runs:
            entry = status.get(run.name, {})
            steps = f"{entry.get('steps', 0):,} / {entry.get('total_steps', 0):,}"
            view.add_row(run.name, entry.get("state", ""), steps, f"{entry.get('wall_s', 0):.0f} s")
        return view

    with Live(table({}), console=console, refresh_per_second=2, transient=False) as live:
        status = run_experiment(
            experiment,
            args.jobs,
            on_update=lambda s: live.update(table(s)),
            ray_address=args.ray_address,
            retries=args.retries,
        )
    failed = [name for name, entry in status.items() if entry["state"] == "failed"]
    for name in failed:
        error = status[name].get("error", "").strip().splitlines()[-3:]
        console.print(f"[red]failed[/] {name}: {' / '.join(error)}", highlight=False)
    console.print(f"\nruns: {experiment.directory}  (shoal report {experiment.directory})",
                  highlight=False)  # fmt: skip
    return 1 if failed else 0


def _tune(args: argparse.Namespace) -> int:
    from shoal.experiment import read_spec
    from shoal.tune import tune

    tuner = tune(read_spec(args.file), args.dir, args.jobs, args.ray_address, args.storage,
                 echo=True)  # fmt: skip
    study = tuner.study()
    best = study.best_trial
    console.print(
        f"{len(study.trials)} trials; best: trial {best.number}, final evaluation return "
        f"{best.value:.2f}, {best.user_attrs['values']}",
        highlight=False,
        markup=False,
    )
    console.print(f"\n# {tuner.directory / 'best.yaml'}", highlight=False, markup=False)
    console.print((tuner.directory / "best.yaml").read_text(), highlight=False, markup=False)
    return 0


def _report(args: argparse.Namespace) -> int:
    from shoal.report import markdown, report

    tables = report(args.dir, args.out)
    console.print(markdown(tables["scores"]), highlight=False, markup=False)
    for row in tables["improvement"]:
        if row["x"] < row["y"]:
            console.print(f"P({row['x']} > {row['y']}) = {row['p_x_better']:.2f}",
                          highlight=False, markup=False)  # fmt: skip
    console.print(tables["method"], highlight=False, markup=False)
    console.print(f"report: {tables['out']} (scores.md, scores.csv, improvement.csv, curves)",
                  highlight=False)  # fmt: skip
    return 0


def _export(args: argparse.Namespace) -> int:
    from shoal.api import load
    from shoal.export import SUFFIX, export, has_mask
    from shoal.policy import ActorPolicy

    policy = load(args.run_dir, trust_code=args.trust_code)
    run_dir = Path(args.run_dir)
    output = args.output or (run_dir if run_dir.is_dir() else run_dir.parent) / (
        "policy" + SUFFIX[args.format]
    )
    files = export(policy, output, args.format)
    masked = isinstance(policy, ActorPolicy) and policy.takes_mask and has_mask(policy)
    for path in files:
        console.print(
            f"exported: {path} ({args.format}; its actions equal shoal.load(RUN).act's on 64 "
            + ("observations and legal-action masks; inputs obs and action_mask)" if masked
               else "observations)"),
            highlight=False,
        )  # fmt: skip
    return 0


def _eval(args: argparse.Namespace) -> int:
    from shoal.api import load, plays_a_game
    from shoal.evaluation import Evaluation
    from shoal.train.checkpoint import load_checkpoint
    from shoal.train.video import record_video

    checkpoint = load_checkpoint(args.run_dir, trust_code=args.trust_code)
    if plays_a_game(checkpoint):  # matches against fixed players, not episodes of an env
        return _eval_matches(args, checkpoint)
    fixed = dict(args.fixed)
    pools = any(spec.startswith("pool:") for spec in fixed.values())
    loader = functools.partial(load, trust_code=args.trust_code)
    evaluation = Evaluation(
        loader(args.run_dir), fixed, _env_kwargs(args.env_kwargs), loader=loader,
        checkpoint=checkpoint if pools else None,
    )  # fmt: skip
    report = evaluation.statistics(args.episodes, args.seed, deterministic=not args.stochastic)
    if _write_report(args, report):
        return 0
    for line in _eval_lines(report, report["env"], args.episodes):
        console.print(line, highlight=False, markup=False)
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

    unused = [flag for flag, given in (("--fixed", args.fixed), ("--video", args.video),
                                       ("--stochastic", args.stochastic),
                                       ("--env.kwargs", args.env_kwargs)) if given]  # fmt: skip
    if unused:
        raise ShoalError(
            f"{', '.join(unused)}: a run that plays a two-player game is evaluated by matches "
            "of its search against a random and a minimax player, which take none of these"
        )
    report = game_report(checkpoint, args.episodes, args.seed)
    if _write_report(args, report):
        return 0
    console.print(f"{args.episodes} games each on {report['env']}, the search "
                  f"({report['simulations']} simulations) with the trained network:",
                  highlight=False, markup=False)  # fmt: skip
    for name, result in report["opponents"].items():
        console.print(f"  vs {name}: {result['wins']} wins, {result['draws']} draws, "
                      f"{result['losses']} losses (score {100 * result['score']:.1f}%)",
                      highlight=False, markup=False)  # fmt: skip
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


def _list(args: argparse.Namespace) -> int:
    if args.envs:
        return _list_envs()
    if args.datasets:
        return _list_datasets()
    from shoal.registry import ALGORITHMS, tuned_examples

    specs = list(ALGORITHMS.values())
    tuned = tuned_examples()
    env_ids = {
        n: e.config.get("env", {}).get("id", "") or e.config.get("dataset", "")
        for n, e in tuned.items()
    }
    if args.long:  # descriptions as indented paragraphs: readable at any width
        console.print("[bold]algorithms[/]", highlight=False)
        for spec in specs:
            _entry(f"{spec.name} ({spec.action_spaces})", spec.summary)
        console.print("\n[bold]tuned examples[/]", highlight=False)
        for example_name, example in tuned.items():
            _entry(f"{example_name}: {example.algo} on {env_ids[example_name]}", example.expected)
        return 0

    # Names never wrap or truncate (they are what users type next), nor do the action spaces;
    # the descriptions are cut with an ellipsis at the terminal's width (--long has them).
    def name(header: str, values: list[str]) -> Column:
        return Column(header, no_wrap=True, min_width=max(map(len, [header, *values])))

    def text(header: str) -> Column:
        return Column(header, no_wrap=True, overflow="ellipsis", ratio=1)

    def one_line(value: str) -> str:
        return " ".join(value.split())

    algos = Table(
        name("algorithm", [s.name for s in specs]),
        Column("actions", ratio=1, overflow="fold"),  # wrapped, never cut: what a learner takes
        text("what"),
        title="algorithms",
        expand=True,
    )
    for spec in specs:
        algos.add_row(spec.name, one_line(spec.action_spaces), one_line(spec.summary))
    console.print(algos)
    examples = Table(
        name("tuned example", list(tuned)),
        name("algorithm", [e.algo for e in tuned.values()]),
        text("env"),
        title="tuned examples",
        expand=True,
    )
    for example_name, example in tuned.items():
        examples.add_row(example_name, example.algo, env_ids[example_name])
    console.print(examples)
    console.print(
        "shoal list --long: with descriptions; shoal list --envs: environment ids",
        highlight=False,
    )
    return 0


def _list_datasets() -> int:
    from shoal.datasets import RECIPES

    table = Table(Column("recipe", no_wrap=True), "source run", "taken at", "minutes",
                  title="dataset recipes")  # fmt: skip
    for recipe in RECIPES.values():
        what = "its replay" if recipe.from_replay else f"{recipe.episodes} episodes"
        table.add_row(recipe.name, f"{recipe.source.tuned} ({recipe.source.name})",
                      f"step {recipe.step:,}: {what}", recipe.source.minutes)  # fmt: skip
    console.print(table)
    console.print("shoal collect --recipe NAME writes datasets/NAME", highlight=False)
    return 0


def _entry(title: str, text: str) -> None:
    console.print(f"  [bold]{escape(title)}[/]", highlight=False)
    width = max(console.width, 40)
    body = textwrap.fill(
        " ".join(text.split()), width, initial_indent="      ", subsequent_indent="      "
    )
    console.print(escape(body), highlight=False)


def _list_envs() -> int:
    from shoal.envs.catalog import catalog

    found = catalog()
    width = max(console.width, 40)
    for group in found.groups:
        console.print(f"[bold]{escape(group.title)}[/]", highlight=False)
        if group.note:
            console.print(f"  {escape(group.note)}", highlight=False)
        line = " "
        for env_id in group.ids:  # ids packed into lines, never cut
            if len(line) + 1 + len(env_id) > width and line.strip():
                console.print(escape(line), highlight=False)
                line = " "
            line += " " + env_id
        if line.strip():
            console.print(escape(line), highlight=False)
    if found.unavailable:
        console.print("[bold]registered but not usable here[/]", highlight=False)
        for env_id, reason in found.unavailable:
            console.print(f"  {escape(env_id)}: {escape(reason)}", highlight=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
