"""BenchMARL's half of benchmarks/marl.py, run in BenchMARL's own virtual environment.

BenchMARL (TorchRL) pins its own TorchRL and TensorDict versions, so it gets a virtual
environment of its own (``make bench-marl`` creates it as ``.venv-benchmarl``); `marl.py` runs
this script with that environment's Python and reads one JSON line from its output.

``--task simple_spread --seed K --frames F ...``: BenchMARL's MAPPO on mpe2's PettingZoo task
(BenchMARL's own PettingZoo tasks import the MPE from ``pettingzoo.mpe``, which PettingZoo
1.25 moved to ``mpe2``; the task here is BenchMARL's PettingZoo task class with the env built
from ``mpe2``, the same env shoal trains on), with the settings `marl.py` passes. Reports the
training wall-clock (collection and updates, BenchMARL's own evaluation and logging off),
env steps per second, and the mean per-agent return of the final deterministic policy over
``--eval-episodes`` episodes.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import tempfile
import time
import warnings

warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)

import torch  # noqa: E402
from benchmarl.algorithms import MappoConfig  # noqa: E402
from benchmarl.environments import PettingZooTask  # noqa: E402
from benchmarl.environments.pettingzoo.common import PettingZooClass  # noqa: E402
from benchmarl.experiment import Experiment, ExperimentConfig  # noqa: E402
from benchmarl.models.mlp import MlpConfig  # noqa: E402
from torchrl.envs import PettingZooWrapper  # noqa: E402
from torchrl.envs.utils import ExplorationType, set_exploration_type  # noqa: E402

TASKS = {"simple_spread": PettingZooTask.SIMPLE_SPREAD, "simple_tag": PettingZooTask.SIMPLE_TAG}


class Mpe2Task(PettingZooClass):
    """BenchMARL's PettingZoo task, the env built from mpe2 (same kwargs)."""

    def get_env_fun(self, num_envs, continuous_actions, seed, device):
        config = dict(self.config)
        module = importlib.import_module(f"mpe2.{config.pop('task')}")
        config["continuous_actions"] = continuous_actions

        def make():
            return PettingZooWrapper(
                env=module.parallel_env(**config),
                categorical_actions=True,
                device=device,
                seed=seed,
                return_state=self.has_state(),
            )

        return make


def task(name: str, max_cycles: int) -> Mpe2Task:
    stock = TASKS[name].get_from_yaml()
    config = dict(stock.config)
    config["task"] = config["task"]  # "simple_spread_v3": a module of mpe2 as well
    config["max_cycles"] = max_cycles
    return Mpe2Task(name=stock.name, config=config)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--task", default="simple_spread", choices=sorted(TASKS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--frames", type=int, default=100_000)
    parser.add_argument("--envs", type=int, default=10)
    parser.add_argument("--frames-per-batch", type=int, default=2000)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--minibatch-frames", type=int, default=400)
    parser.add_argument("--hidden", type=int, nargs="+", default=[64, 64])
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--max-cycles", type=int, default=25)
    parser.add_argument("--eval-episodes", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    config = ExperimentConfig.get_from_yaml()
    config.sampling_device = config.train_device = config.buffer_device = "cpu"
    config.prefer_continuous_actions = False
    config.share_policy_params = True
    config.gamma = 0.99
    config.lr = args.lr
    config.adam_eps = 1e-5
    config.clip_grad_norm, config.clip_grad_val = True, 0.5
    config.max_n_frames = args.frames
    config.on_policy_collected_frames_per_batch = args.frames_per_batch
    config.on_policy_n_envs_per_worker = args.envs
    config.on_policy_n_minibatch_iters = args.epochs
    config.on_policy_minibatch_size = args.minibatch_frames
    config.evaluation = False
    config.loggers = []
    config.create_json = False
    config.checkpoint_interval = 0
    config.checkpoint_at_end = False
    config.save_folder = tempfile.mkdtemp()
    config.render = False
    algorithm = MappoConfig.get_from_yaml()
    algorithm.entropy_coef = 0.0
    algorithm.lmbda = 0.95
    algorithm.critic_coef = 0.5
    model = MlpConfig(
        num_cells=list(args.hidden), activation_class=torch.nn.Tanh, layer_class=torch.nn.Linear
    )
    start = time.perf_counter()
    experiment = Experiment(
        task=task(args.task, args.max_cycles),
        algorithm_config=algorithm,
        model_config=model,
        critic_model_config=model,
        seed=args.seed,
        config=config,
    )
    setup_s = time.perf_counter() - start
    begin = time.perf_counter()
    experiment.run()
    train_s = time.perf_counter() - begin
    score = evaluate(experiment, args.eval_episodes, args.max_cycles, args.seed)
    print(
        json.dumps(
            {
                "library": "benchmarl",
                "task": args.task,
                "seed": args.seed,
                "env_steps": experiment.total_frames,
                "train_s": train_s,
                "setup_s": setup_s,
                "env_steps_per_s": experiment.total_frames / train_s,
                "score": score,
                "torch_threads": args.threads,
                "cpus": os.cpu_count(),
            }
        )
    )


@torch.no_grad()
def evaluate(experiment: Experiment, episodes: int, max_cycles: int, seed: int) -> dict:
    """Mean return per agent (and per group) of the deterministic policy over ``episodes``
    whole episodes, one env at a time."""
    env = experiment.test_env
    totals: dict[str, list[float]] = {}
    for episode in range(episodes):
        env.set_seed(10_000 + 97 * seed + episode)
        with set_exploration_type(ExplorationType.DETERMINISTIC):
            rollout = env.rollout(max_cycles, policy=experiment.policy, auto_reset=True)
        for group in experiment.group_map:
            reward = rollout.get(("next", group, "reward"))  # [T, N, 1]
            totals.setdefault(group, []).append(float(reward.sum(0).mean()))
    out = {f"return/{g}": sum(v) / len(v) for g, v in totals.items()}
    every = [x for v in totals.values() for x in v]
    out["return"] = sum(every) / len(every)
    return out


if __name__ == "__main__":
    main()
