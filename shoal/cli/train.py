"""``shoal train``: an algorithm's config from the command line, trained.

``shoal train ppo --env CartPole-v1 --num-epochs 2``: options after the algorithm name are the
fields of its config dataclass (nested blocks with a dot: ``--run.seed 3``, ``--env.num-envs
16``), parsed by tyro from the same dataclasses that the YAML tuned examples fill in.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import typing
from typing import Any

from shoal.cli.shared import STOP_EXIT_CODES, console, plain
from shoal.core.errors import ShoalError

# Short flags for the most used fields, translated to their dotted tyro names.
SHORTHANDS = {
    "--env": "--env.id",
    "--seed": "--run.seed",
    "--total-steps": "--run.total-steps",
    "--run-dir": "--run.run-dir",
    "--target-return": "--run.target-return",
    "--num-envs": "--env.num-envs",
    "--runners": "--run.runners",
    "--learners": "--run.learners",
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
                    --target-return, --num-envs, --runners, --learners, --ray-address)

shoal train ALGO --help lists every field of ALGO's config with its default and meaning.

examples:
  shoal train ppo --env CartPole-v1
  shoal train --tuned sac-pendulum --seed 3
  shoal train --resume runs/ppo-CartPole-v1-... --run.total-steps 500000
  shoal train ppo --env CartPole-v1 --env.frame-stack 4
  shoal train ppo --env CartPole-v1 --model.encoder mynets:Wide       # your nn.Module
  shoal train ppo --env CartPole-v1 --run.callbacks "EarlyStopping(patience=5)" SaveBest"""


def add_parser(commands: Any) -> None:
    """``shoal train`` in ``shoal --help``; `split_args`, not argparse, reads its arguments."""
    commands.add_parser("train", help="train an agent (shoal train ALGO --help)")


def run(argv: list[str]) -> int:
    """``shoal train`` with the arguments after ``train``."""
    from shoal.api import train

    args, rest = split_args(argv)
    built = train_config(args, rest)
    if built is None:
        return 0
    spec, config = built
    dataset = getattr(config, "dataset", "")
    where = f"the dataset {dataset}" if dataset else config.env.id
    console.print(f"training [bold]{spec.name}[/] on [bold]{where}[/]", highlight=False)
    result = train(config, resume=args.resume, trust_code=args.trust_code)
    _print_result(result, spec, config)
    return STOP_EXIT_CODES.get(result.stop_reason, 0)


def split_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
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


def train_config(args: argparse.Namespace, rest: list[str]) -> tuple[Any, Any] | None:
    """The algorithm and the config ``shoal train`` would train with, from `split_args`'s
    split of its arguments: built and checked, nothing trained; None after printing the
    help. tests/test_examples.py checks every ``shoal train`` line of the docs with it."""
    import tyro

    from shoal.config import from_dict
    from shoal.registry import find_tuned, get_algorithm
    from shoal.train.checkpoint import load_checkpoint

    if args.resume:
        checkpoint = load_checkpoint(args.resume, trust_code=args.trust_code, set_aside=True)
        spec = get_algorithm(checkpoint.algo)
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
        plain(TRAIN_HELP)
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


def _print_result(result: Any, spec: Any, config: Any) -> None:
    """The summary of a run: why it stopped, its times and last evaluation, where it is, and
    the commands that go on from it (each only where it works)."""
    run_dir = result.run_dir
    lines = [
        f"stopped:     {result.stop_detail}",
        f"time:        {_times(result)}",
        (f"eval:        {_scores_text(result)}" if result.eval_return is None
         and result.eval_scores else f"eval return: {_eval_text(result, spec, config)}"),
        f"run:         {run_dir}",
        f"checkpoint:  {result.checkpoint}",
    ]  # fmt: skip
    if result.stop_reason in STOP_EXIT_CODES:  # Ctrl-C or SIGTERM: the run goes on from here
        lines.append(f"resume:      shoal train --resume {run_dir}")
    if spec.deploys:
        lines.append(f"evaluate:    shoal eval {run_dir}")
    else:
        lines.append(f"evaluate:    none: {spec.name} keeps no policy (it plans with the env's "
                     "own state); metrics.jsonl holds its episodes' returns")  # fmt: skip
    if config.run.tensorboard:
        lines.append(f"tensorboard: tensorboard --logdir {run_dir / 'tb'}")
    console.print("\n".join(lines), highlight=False)


def _scores_text(result: Any) -> str:
    """An algorithm's own last evaluation (AlphaZero's matches): ``vs_random score 1.00,
    vs_minimax score 0.50, vs_minimax loss_rate 0.00 at env step 512``."""
    scores = dict(result.eval_scores)
    step = int(scores.pop("step"))
    each = ", ".join(f"{k.removeprefix('eval/').replace('/', ' ')} {v:.2f}"
                     for k, v in scores.items())  # fmt: skip
    return f"{each} at {result.unit} {step:,}"


def _times(result) -> str:
    """This process's wall-clock and training seconds, and the whole run's training seconds
    when it was resumed."""
    session_train = result.train_s if result.session_train_s is None else result.session_train_s
    text = f"{result.wall_s:.1f} s in this process, {session_train:.1f} s of it training"
    if result.resumed_from is not None:
        text += f"; {result.train_s:.1f} s training over the whole run"
    return text


def _eval_text(result: Any, spec: Any, config: Any) -> str:
    if result.eval_return is None:
        from shoal.envs.games import is_game_id

        if spec.match_report is not None and is_game_id(config.env.id):
            return (f"none yet ({spec.name} plays its evaluation matches every eval_every "
                    f"iterations: {config.eval_every})")  # fmt: skip
        return "none (run.eval_every_steps is 0)"
    text = f"{result.eval_return:.1f}"
    if result.eval_step is not None:
        text += f" at {result.unit} {result.eval_step:,}"
        if result.eval_step != result.env_steps:
            text += f" (the run ended at {result.env_steps:,})"
    return text
