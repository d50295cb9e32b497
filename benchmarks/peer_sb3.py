"""Stable-Baselines3 side of ``benchmarks/peers.py``: one row, one seed, one JSON line.

As rl-baselines3-zoo builds each row: ``make_vec_env`` (``DummyVecEnv``) for CartPole and
HalfCheetah, ``make_atari_env`` + ``VecFrameStack(4)`` for Pong, ``PPO``/``SAC``/``DQN`` with
the settings of ``peer_settings.ROWS``. Throughput times ``learn()`` (model and env
construction left out; Pong after an untimed iteration); SAC's updates/s is the time of the
gradient steps after ``learning_starts`` (a callback marks the start). Solve runs evaluate in
a callback at each rollout start once ``eval_every`` env steps have passed, the clock
paused. Runs in shoal's ``.venv`` with the bench extra (SB3 does not conflict with it).
"""

from __future__ import annotations

import time

import torch
from peer_settings import Solver, side_main
from stable_baselines3 import DQN, PPO, SAC
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_atari_env, make_vec_env
from stable_baselines3.common.vec_env import VecFrameStack


class Stop(BaseCallback):
    """Marks the start of the timed part and stops ``learn`` at a step count; with a
    `Solver`, evaluates at rollout starts and stops once solved."""

    def __init__(self, start_at: int, stop_at: int, solver: Solver | None = None) -> None:
        super().__init__()
        self.start_at, self.stop_at, self.solver = start_at, stop_at, solver
        self.started: float | None = None
        self.steps_at_start = 0
        self.stopped = False

    def _on_rollout_start(self) -> None:
        if self.solver is not None and self.solver.check(self.num_timesteps):
            self.stopped = True

    def _on_step(self) -> bool:
        if self.started is None and self.num_timesteps >= self.start_at:
            self.started, self.steps_at_start = time.perf_counter(), self.num_timesteps
        return not self.stopped and self.num_timesteps < self.stop_at


def run_ppo(row: dict, seed: int, mode: str, pixels: bool) -> dict:
    if pixels:
        import ale_py
        import gymnasium as gym

        gym.register_envs(ale_py)
        env = VecFrameStack(make_atari_env(row["env"], n_envs=row["num_envs"], seed=seed), 4)
        policy, kwargs = "CnnPolicy", {}
    else:
        env = make_vec_env(row["env"], n_envs=row["num_envs"], seed=seed)
        act = {"tanh": torch.nn.Tanh, "relu": torch.nn.ReLU}[row["activation"]]
        policy = "MlpPolicy"
        kwargs = {"net_arch": {"pi": row["hidden"], "vf": row["hidden"]}, "activation_fn": act}
    model = PPO(
        policy, env, n_steps=row["num_steps"], batch_size=row["minibatch_size"],
        n_epochs=row["num_epochs"], learning_rate=row["lr"], clip_range=row["clip_eps"],
        gamma=row["gamma"], gae_lambda=row["gae_lambda"], ent_coef=row["ent_coef"],
        vf_coef=row["vf_coef"], max_grad_norm=row["max_grad_norm"], policy_kwargs=kwargs,
        seed=seed, device="cpu", verbose=0,
    )  # fmt: skip
    if mode == "solve":
        solver = Solver(row, lambda obs: model.predict(obs, deterministic=True)[0])
        callback = Stop(0, row["solve_budget"] + 1, solver)
        model.learn(row["solve_budget"], callback=callback)
        return solver.result(model.num_timesteps)
    warmup = row.get("warmup_steps", 0)
    callback = Stop(warmup, warmup + row["throughput_steps"] + 1)
    model.learn(warmup + row["throughput_steps"], callback=callback)
    seconds = time.perf_counter() - callback.started
    steps = model.num_timesteps - callback.steps_at_start
    return {"env_steps_per_s": steps / seconds, "env_steps": steps}


def run_sac(row: dict, seed: int) -> dict:
    env = make_vec_env(row["env"], n_envs=1, seed=seed)
    model = SAC(
        "MlpPolicy", env, learning_rate=row["lr"], buffer_size=row["buffer_size"],
        learning_starts=row["learning_starts"], batch_size=row["batch_size"], tau=row["tau"],
        gamma=row["gamma"], train_freq=1, gradient_steps=1,
        policy_kwargs={"net_arch": row["hidden"]}, seed=seed, device="cpu", verbose=0,
    )  # fmt: skip
    callback = Stop(row["learning_starts"], 10**9)
    model.learn(row["learning_starts"] + row["timed_updates"], callback=callback)
    seconds = time.perf_counter() - callback.started
    updates = model._n_updates
    return {"updates_per_s": updates / seconds, "updates": int(updates)}


def run_dqn(row: dict, seed: int, mode: str) -> dict:
    env = make_vec_env(row["env"], n_envs=1, seed=seed)
    total = row["solve_budget"] if mode == "solve" else row["throughput_steps"]
    model = DQN(
        "MlpPolicy", env, learning_rate=row["lr"], batch_size=row["batch_size"],
        buffer_size=row["buffer_size"], learning_starts=row["learning_starts"],
        gamma=row["gamma"], target_update_interval=10, train_freq=row["train_freq"],
        gradient_steps=row["gradient_steps"], exploration_fraction=row["exploration_fraction"],
        exploration_final_eps=row["exploration_final_eps"], max_grad_norm=row["max_grad_norm"],
        policy_kwargs={"net_arch": row["hidden"]}, seed=seed, device="cpu", verbose=0,
    )  # fmt: skip
    solver = None
    if mode == "solve":
        solver = Solver(row, lambda obs: model.predict(obs, deterministic=True)[0])
    callback = Stop(0, total + 1, solver)
    start = time.perf_counter()
    model.learn(total, callback=callback)
    if solver is not None:
        return solver.result(model.num_timesteps)
    return {"env_steps_per_s": model.num_timesteps / (time.perf_counter() - start),
            "env_steps": model.num_timesteps}  # fmt: skip


if __name__ == "__main__":
    side_main(
        __doc__, run_ppo, run_sac, run_dqn, lambda: __import__("stable_baselines3").__version__
    )
