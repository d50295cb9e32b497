"""LightZero's MuZero on CartPole, timed: the peer side of benchmarks/muzero.py.

Runs LightZero's own CartPole MuZero config (``zoo/classic_control/cartpole/config/
cartpole_muzero_config.py``, unchanged but for the CPU, one in-process env manager and the
seed) until its evaluation reaches the config's stop value (200 on CartPole-v0) or
``--max-env-steps``, then prints one JSON line: every evaluation's collector env steps, mean
return and seconds since the run's first evaluation (read from the TensorBoard scalars
LightZero writes, ``evaluator_step/eval_episode_return_mean``). Run it with
``.venv-lightzero/bin/python`` (``make .venv-lightzero/.installed``: LightZero 0.2.0 pins
gymnasium 0.28 and NumPy < 2, so it has its own environment).
"""

from __future__ import annotations

import argparse
import copy
import glob
import json
import os
import tempfile
import time

TAG = "evaluator_step/eval_episode_return_mean"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-env-steps", type=int, default=100_000)
    args = parser.parse_args()
    import torch
    from lzero.entry import train_muzero
    from zoo.classic_control.cartpole.config import cartpole_muzero_config as lz

    torch.set_num_threads(1)
    main_config = copy.deepcopy(lz.main_config)
    create_config = copy.deepcopy(lz.create_config)
    main_config.policy.cuda = False
    create_config.env_manager.type = "base"
    workdir = tempfile.mkdtemp(prefix="lightzero-")
    os.chdir(workdir)
    main_config.exp_name = os.path.join(workdir, "cartpole_muzero")
    started = time.perf_counter()
    policy = train_muzero([main_config, create_config], seed=args.seed,
                          max_env_step=args.max_env_steps)  # fmt: skip
    wall = time.perf_counter() - started
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    evaluations = []
    for path in glob.glob(os.path.join(workdir, "**", "events.out.tfevents.*"), recursive=True):
        events = EventAccumulator(path)
        events.Reload()
        if TAG in events.Tags()["scalars"]:
            evaluations += [(e.step, e.value, e.wall_time) for e in events.Scalars(TAG)]
    evaluations.sort()
    first = evaluations[0][2] if evaluations else 0.0
    print(json.dumps({"library": "lightzero", "seed": args.seed, "process_s": round(wall, 1),
                      "policy": type(policy).__name__,
                      "evaluations": [[int(step), float(value), round(when - first, 1)]
                                      for step, value, when in evaluations]}))  # fmt: skip


if __name__ == "__main__":
    main()
