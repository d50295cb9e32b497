"""RLlib's half of benchmarks/scaling.py, run in RLlib's own virtual environment.

``ray[rllib]`` pins an older Gymnasium than shoal, so it cannot share shoal's environment:
`scaling.py` runs this script with the RLlib environment's Python (``make bench-scaling``
creates it as ``.venv-rllib``) and reads one JSON line from its output.

* ``sample --runners N --envs E --steps S --repeats R``: env-steps/s of RLlib's env runners
  sampling CartPole-v1 in parallel, ``S`` steps per env per call, as shoal's RaySampler does.
* ``ppo --runners N --seed K``: RLlib PPO (its CartPole defaults) trained until the mean
  training episode return reaches 475; wall-clock from Ray start to solved, and env steps.
* ``train --algo sac|dqn --env ID --runners N --envs E --fragment F --updates K --batch B
  --hidden H [H ...] --seconds S``: env-steps/s of RLlib's training iterations (sampling,
  storing, learning) after its learning starts, with K updates of B transitions per round of
  F steps of E envs on each of N runners (``training_intensity`` set to give that round
  robin), and the updates per env step it reached.
* ``learners --learners N --batch B --minibatch M --epochs E --hidden H [H ...]``: seconds
  of RLlib PPO's learner update per training iteration with N learners (0: the driver's
  local learner), as `benchmarks/learners.py` times shoal's.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time

T0 = time.perf_counter()

os.environ.setdefault("RAY_DEDUP_LOGS", "0")
logging.disable(logging.WARNING)

import ray  # noqa: E402
from ray.rllib.algorithms.ppo import PPOConfig  # noqa: E402

SOLVED = 475.0


def ppo_config(runners: int, envs: int, seed: int) -> PPOConfig:
    return (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=runners, num_envs_per_env_runner=envs)
        .debugging(seed=seed, log_level="ERROR")
        .reporting(min_time_s_per_iteration=0)
    )


def sample(args: argparse.Namespace) -> dict:
    start = time.perf_counter()
    ray.init(num_cpus=max(os.cpu_count() or 1, args.runners + 1), include_dashboard=False)
    algo = ppo_config(args.runners, args.envs, 0).build_algo()
    setup_s = time.perf_counter() - start
    group = algo.env_runner_group
    per_call = args.steps * args.envs

    def one_round() -> int:
        lengths = group.foreach_env_runner(
            lambda runner: sum(len(e) for e in runner.sample(num_timesteps=per_call)),
            local_env_runner=False,
        )
        return int(sum(lengths))

    one_round()  # warm-up: first calls build connectors and compile nothing else
    rates = []
    for _ in range(args.repeats):
        begin = time.perf_counter()
        steps = 0
        for _ in range(args.calls):
            steps += one_round()
        rates.append(steps / (time.perf_counter() - begin))
    algo.stop()
    return {"setup_s": setup_s, "steps_per_s": sorted(rates)[len(rates) // 2], "rates": rates}


def ppo(args: argparse.Namespace) -> dict:
    start = time.perf_counter()
    ray.init(num_cpus=max(os.cpu_count() or 1, args.runners + 1), include_dashboard=False)
    algo = ppo_config(args.runners, 1, args.seed).build_algo()
    steps, ret = 0, float("-inf")
    while time.perf_counter() - start < args.max_s:
        result = algo.train()
        steps = int(result["env_runners"]["num_env_steps_sampled_lifetime"])
        ret = float(result["env_runners"].get("episode_return_mean", float("nan")))
        if ret >= SOLVED:
            break
    wall = time.perf_counter() - start
    algo.stop()
    return {"solved": ret >= SOLVED, "wall_s": wall, "env_steps": steps, "return": ret}


def train(args: argparse.Namespace) -> dict:
    from ray.rllib.algorithms.dqn import DQNConfig
    from ray.rllib.algorithms.sac import SACConfig

    ray.init(num_cpus=max(os.cpu_count() or 1, args.runners + 1), include_dashboard=False)
    config = SACConfig() if args.algo == "sac" else DQNConfig()
    # RLlib's round robin: K updates per sampling round where training_intensity / native
    # ratio = K, native ratio = B / (F x E x max(N + 1, 1)) (its dqn.calculate_rr_weights).
    native = args.batch / (args.fragment * args.envs * max(args.runners + 1, 1))
    config = (
        config.environment(args.env)
        .env_runners(
            num_env_runners=args.runners,
            num_envs_per_env_runner=args.envs,
            rollout_fragment_length=args.fragment,
        )
        .training(
            train_batch_size_per_learner=args.batch,
            training_intensity=args.updates * native,
            num_steps_sampled_before_learning_starts=args.learning_starts,
        )
        .rl_module(model_config={"fcnet_hiddens": list(args.hidden)})
        .debugging(seed=0, log_level="ERROR")
        .reporting(min_time_s_per_iteration=0, min_sample_timesteps_per_iteration=0)
    )
    algo = config.build_algo()

    def counts(result: dict) -> tuple[int, int]:
        sampled = int(result["env_runners"]["num_env_steps_sampled_lifetime"])
        learners = result.get("learners", {}).get("__all_modules__", {})
        return sampled, int(learners.get("num_env_steps_trained_lifetime", 0))

    sampled = 0
    while sampled <= args.learning_starts:
        sampled, _ = counts(algo.train())
    sampled0, trained0 = counts(algo.train())  # warm-up of the learner
    begin = time.perf_counter()
    while time.perf_counter() - begin < args.seconds:
        sampled, trained = counts(algo.train())
    elapsed = time.perf_counter() - begin
    algo.stop()
    return {
        "steps_per_s": (sampled - sampled0) / elapsed,
        "updates_per_env_step": (trained - trained0) / args.batch / max(1, sampled - sampled0),
    }


def learners(args: argparse.Namespace) -> dict:
    """RLlib PPO's learner update (seconds per call of its learner group's ``update``, one
    per training iteration) with ``--learners`` N (0: the local learner in the driver), on one
    fixed-size train batch of ``--batch`` steps, ``--epochs`` epochs of minibatches of
    ``--minibatch`` (both split among the learners: RLlib's sizes are per learner), MLPs of
    ``--hidden`` units for policy and value, one CPU and one torch thread per learner."""
    n = max(1, args.learners)
    ray.init(num_cpus=max(os.cpu_count() or 1, args.learners + 2), include_dashboard=False)
    config = (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=0, num_envs_per_env_runner=16)
        .learners(num_learners=args.learners, num_cpus_per_learner=1)
        .training(
            train_batch_size_per_learner=args.batch // n,
            minibatch_size=args.minibatch // n,
            num_epochs=args.epochs,
        )
        .rl_module(model_config={"fcnet_hiddens": list(args.hidden), "vf_share_layers": False})
        .debugging(seed=0, log_level="ERROR")
        .reporting(min_time_s_per_iteration=0, min_sample_timesteps_per_iteration=0)
    )
    algo = config.build_algo()
    # Each call of its learner group's update timed as it is made (RLlib's own
    # learner_update_timer is a moving average that the first, warm-up call dominates).
    update = algo.learner_group.update
    updates: list[float] = []

    def timed(*call_args: object, **kwargs: object) -> object:
        start = time.perf_counter()
        result = update(*call_args, **kwargs)
        updates.append(time.perf_counter() - start)
        return result

    algo.learner_group.update = timed
    algo.train()  # warm-up
    updates.clear()
    iterations = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        algo.train()
        iterations.append(time.perf_counter() - start)
    algo.stop()
    return {"learners": args.learners, "update_s": updates, "iteration_s": iterations}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("mode", choices=["sample", "ppo", "train", "learners"])
    parser.add_argument("--learners", type=int, default=0)
    parser.add_argument("--minibatch", type=int, default=2048)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--algo", choices=["sac", "dqn"], default="sac")
    parser.add_argument("--env", default="Pendulum-v1")
    parser.add_argument("--fragment", type=int, default=16)
    parser.add_argument("--updates", type=int, default=16)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--hidden", type=int, nargs="+", default=[256, 256])
    parser.add_argument("--learning-starts", type=int, default=1_000)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--runners", type=int, default=1)
    parser.add_argument("--envs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-s", type=float, default=600.0)
    args = parser.parse_args()
    modes = {"sample": sample, "ppo": ppo, "train": train, "learners": learners}
    out = modes[args.mode](args)
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
