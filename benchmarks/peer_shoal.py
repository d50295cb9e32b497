"""shoal side of ``benchmarks/peers.py``: one row, one seed, one JSON line.

shoal's ``train`` with the settings of ``peer_settings.ROWS`` in shoal's config names, each
row as the library runs it by default (natively vectorized envs where Gymnasium or ale-py has
them, the NumPy path for the small MLPs, one torch thread). Throughput is
``RunResult.train_s`` (rollouts and updates; set-up, evaluation and checkpoints left out);
solve runs evaluate every ``eval_every`` env steps with ``peer_settings.evaluate_cartpole``
through a callback, with the clock paused. ``--variant`` picks the Pong rows' APPO (sampling
during the update) and the two-thread runs.
"""

from __future__ import annotations

import tempfile
from typing import Any

from peer_settings import Solver, side_main, side_parser

import shoal
from shoal.train.callbacks import Callback

QUIET = {"run.console": False, "run.tensorboard": False, "run.eval_every_steps": 0,
         "run.checkpoint_every_steps": 0}  # fmt: skip


def ppo_overrides(row: dict, pixels: bool) -> dict[str, Any]:
    base = {
        "env.num_envs": row["num_envs"], "num_steps": row["num_steps"],
        "num_epochs": row["num_epochs"], "minibatch_size": row["minibatch_size"],
        "optim.lr": row["lr"], "clip_eps": row["clip_eps"], "gamma": row["gamma"],
        "gae_lambda": row["gae_lambda"], "ent_coef": row["ent_coef"], "vf_coef": row["vf_coef"],
        "optim.max_grad_norm": row["max_grad_norm"],
    }  # fmt: skip
    if pixels:
        return {**base, "env.atari": "deepmind", "model.encoder": "nature",
                "model.shared_trunk": True}  # fmt: skip
    return {**base, "model.hidden": tuple(row["hidden"]), "model.activation": row["activation"]}


def throughput(algo: str, row: dict, seed: int, overrides: dict, steps: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        result = shoal.train(algo, env=row["env"], seed=seed, total_steps=steps,
                             run_dir=f"{tmp}/run", **QUIET, **overrides)  # fmt: skip
    return {"env_steps_per_s": result.env_steps / result.train_s, "env_steps": result.env_steps}


class Solve(Callback):
    """Evaluates the current policy with the peers' evaluator every ``eval_every`` env steps,
    the clock paused; stops the run once solved. The clock starts with the first iteration
    (env and model set-up left out, as for the peers)."""

    def __init__(self, row: dict) -> None:
        self.row = row

    def on_train_start(self, context: Any) -> None:
        super().on_train_start(context)
        self.solver = Solver(self.row, lambda obs: context.policy().act(obs))

    def on_iteration(self, metrics: dict[str, float]) -> bool:
        return self.solver.check(self.context.env_steps)


def run(algo: str, row: dict, seed: int, mode: str, overrides: dict) -> dict:
    """A solve run, or a throughput run of the row's steps (Pong after an untimed one: the
    ROM, lazy imports, the allocator)."""
    if mode == "solve":
        callback = Solve(row)
        with tempfile.TemporaryDirectory() as tmp:
            result = shoal.train(algo, env=row["env"], seed=seed, total_steps=row["solve_budget"],
                                 run_dir=f"{tmp}/run", callbacks=[callback], **QUIET,
                                 **overrides)  # fmt: skip
        return callback.solver.result(result.env_steps)
    if "warmup_steps" in row:
        throughput(algo, row, seed, overrides, row["warmup_steps"])
    return throughput(algo, row, seed, overrides, row["throughput_steps"])


def run_ppo(row: dict, seed: int, mode: str, pixels: bool, variant: str) -> dict:
    overrides = ppo_overrides(row, pixels)
    algo = "appo" if variant.startswith("appo") else "ppo"
    if algo == "appo":  # PPO's settings go in APPO's ppo block
        overrides = {k if k.startswith("env.") else f"ppo.{k}": v for k, v in overrides.items()}
    if variant.endswith("-2t"):
        overrides["run.torch_threads"] = 2
    return run(algo, row, seed, mode, overrides)


def run_dqn(row: dict, seed: int, mode: str) -> dict:
    total = row["solve_budget"] if mode == "solve" else row["throughput_steps"]
    return run("dqn", row, seed, mode, dqn_overrides(row, total))


def dqn_overrides(row: dict, total: int) -> dict[str, Any]:
    """The zoo's DQN in shoal's names: one env, 256 env steps and 128 gradient steps an
    iteration, plain (not double) Q-learning."""
    return {
        "env.num_envs": 1, "model.hidden": tuple(row["hidden"]), "model.activation": "relu",
        "optim.lr": row["lr"], "optim.max_grad_norm": row["max_grad_norm"],
        "replay.batch_size": row["batch_size"], "replay.buffer_size": row["buffer_size"],
        "replay.learning_starts": row["learning_starts"], "gamma": row["gamma"],
        "target_update_every": row["target_update_gradient_steps"],
        "rollout_steps": row["train_freq"], "replay.gradient_steps": row["gradient_steps"],
        "exploration_steps": int(row["exploration_fraction"] * total),
        "epsilon_end": row["exploration_final_eps"], "double_q": False, "loss": "huber",
    }  # fmt: skip


def run_sac(row: dict, seed: int) -> dict:
    """Updates/s after learning_starts: the time of a run of learning_starts + timed_updates
    steps minus that of a run of learning_starts + 1 steps (the random-action steps and
    set-up), both from ``RunResult.train_s``."""
    overrides = {
        "model.hidden": tuple(row["hidden"]), "replay.batch_size": row["batch_size"],
        "optim.lr": row["lr"], "gamma": row["gamma"], "tau": row["tau"],
        "replay.buffer_size": row["buffer_size"], "replay.learning_starts": row["learning_starts"],
    }  # fmt: skip
    times = []
    for steps in (row["learning_starts"] + 1, row["learning_starts"] + row["timed_updates"]):
        with tempfile.TemporaryDirectory() as tmp:
            result = shoal.train("sac", env=row["env"], seed=seed, total_steps=steps,
                                 run_dir=f"{tmp}/run", **QUIET, **overrides)  # fmt: skip
        times.append(result.train_s)
    updates = row["timed_updates"] - 1
    return {"updates_per_s": updates / (times[1] - times[0]), "updates": updates}


if __name__ == "__main__":
    parser = side_parser(__doc__)
    parser.add_argument("--variant", default="ppo", choices=["ppo", "appo", "ppo-2t", "appo-2t"])
    side_main(__doc__, run_ppo, run_sac, run_dqn, lambda: f"shoal {shoal.__version__}", parser)
