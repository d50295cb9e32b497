"""d3rlpy's side of benchmarks/offline.py, run with the d3rlpy virtual environment's Python
(``make bench-offline`` builds it: d3rlpy pins gymnasium 1.0, so it lives apart from shoal).

Reads the same Minari dataset files as shoal (with Minari's own reader, no env built), trains
IQL, CQL or TD3+BC for a number of updates with the settings shoal uses, times the updates
alone, evaluates the deterministic policy for some episodes, and prints one JSON line.

    .venv-d3rlpy/bin/python benchmarks/offline_d3rlpy_side.py '{"dataset": "...", ...}'
"""

from __future__ import annotations

import json
import sys
import time

import d3rlpy
import gymnasium as gym
import numpy as np
import torch
from minari.dataset.minari_storage import MinariStorage


def mdp_dataset(path: str) -> tuple[d3rlpy.dataset.MDPDataset, str]:
    storage = MinariStorage.read(path)
    episodes = list(storage.get_episodes(range(storage.total_episodes)))
    obs, actions, rewards, terminals, timeouts = [], [], [], [], []
    for e in episodes:
        n = len(e["rewards"])
        obs.append(np.asarray(e["observations"][:n], np.float32))
        actions.append(np.asarray(e["actions"], np.float32))
        rewards.append(np.asarray(e["rewards"], np.float32))
        terminated = np.asarray(e["terminations"], np.float32)
        truncated = np.asarray(e["truncations"], np.float32)
        truncated[-1] = max(truncated[-1], 1.0 - terminated[-1])  # every episode ends
        terminals.append(terminated)
        timeouts.append(truncated)
    env_id = json.loads(storage.metadata["shoal_env"])["id"]
    dataset = d3rlpy.dataset.MDPDataset(
        np.concatenate(obs), np.concatenate(actions), np.concatenate(rewards),
        np.concatenate(terminals), np.concatenate(timeouts),
    )  # fmt: skip
    return dataset, env_id


def build(algo: str, hidden: list[int], batch: int):
    encoder = d3rlpy.models.encoders.VectorEncoderFactory(hidden_units=hidden)
    scaler = d3rlpy.preprocessing.StandardObservationScaler()
    actions = d3rlpy.preprocessing.MinMaxActionScaler()
    common = dict(batch_size=batch, actor_encoder_factory=encoder, critic_encoder_factory=encoder,
                  observation_scaler=scaler, action_scaler=actions)  # fmt: skip
    if algo == "iql":
        return d3rlpy.algos.IQLConfig(**common, value_encoder_factory=encoder,
                                      actor_learning_rate=3e-4, critic_learning_rate=3e-4,
                                      expectile=0.7, weight_temp=3.0, max_weight=100.0)  # fmt: skip
    if algo == "cql":  # shoal's fixed weight 5: d3rlpy's alpha kept at 1 (no Lagrange step)
        return d3rlpy.algos.CQLConfig(**common, actor_learning_rate=1e-4,
                                      critic_learning_rate=3e-4, temp_learning_rate=1e-4,
                                      alpha_learning_rate=0.0, conservative_weight=5.0,
                                      n_action_samples=10)  # fmt: skip
    if algo == "td3-bc":
        return d3rlpy.algos.TD3PlusBCConfig(**common, actor_learning_rate=3e-4,
                                            critic_learning_rate=3e-4, alpha=2.5)  # fmt: skip
    raise SystemExit(f"unknown algo {algo}")


def main() -> None:
    args = json.loads(sys.argv[1])
    torch.set_num_threads(1)  # as shoal's run.torch_threads
    d3rlpy.seed(args["seed"])
    dataset, env_id = mdp_dataset(args["dataset"])
    algo = build(args["algo"], args["hidden"], args["batch"]).create(device="cpu:0")
    algo.build_with_dataset(dataset)
    updates = args["updates"]
    started = time.perf_counter()
    algo.fit(dataset, n_steps=updates, n_steps_per_epoch=updates, show_progress=False,
             logger_adapter=d3rlpy.logging.NoopAdapterFactory(), save_interval=10**9)  # fmt: skip
    train_s = time.perf_counter() - started
    env = gym.make(env_id)
    returns = []
    for k in range(args["eval_episodes"]):
        obs, _ = env.reset(seed=args["eval_seed"] + k)
        total, done = 0.0, False
        while not done:
            action = algo.predict(np.asarray(obs, np.float32)[None])[0]
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    print(json.dumps({"train_s": train_s, "updates": updates, "returns": returns,
                      "version": d3rlpy.__version__}))  # fmt: skip


if __name__ == "__main__":
    main()
