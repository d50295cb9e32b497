"""Tianshou side of ``benchmarks/peers.py``: one row, one seed, one JSON line.

Written as Tianshou 2's own examples train (``examples/atari/atari_ppo.py``,
``examples/mujoco/mujoco_sac.py``, ``examples/discrete/discrete_dqn.py``): an algorithm
(``PPO``, ``SAC``, ``DQN``) over its policy and networks, a ``Collector`` over a vector env
and ``algorithm.run_training`` with the trainer's parameters; with the settings of
``peer_settings.ROWS``. Throughput is the trainer's own training time (collection plus
updates, ``InfoStats.timing.train_time``); solve runs test every ``eval_every`` env steps on
20 episodes with the policy's deterministic actions and stop at the target, the tests left
out of the time. Runs in ``.venv-tianshou``.
"""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import torch
from peer_settings import EVAL_EPISODES, EVAL_SEED, side_main
from tianshou.algorithm import DQN, PPO, SAC
from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
from tianshou.algorithm.modelfree.reinforce import DiscreteActorPolicy
from tianshou.algorithm.modelfree.sac import AutoAlpha, SACPolicy
from tianshou.algorithm.optim import AdamOptimizerFactory
from tianshou.data import Collector, CollectStats, ReplayBuffer, VectorReplayBuffer
from tianshou.env import DummyVectorEnv
from tianshou.trainer import OffPolicyTrainerParams, OnPolicyTrainerParams
from tianshou.utils.net.common import Net
from tianshou.utils.net.continuous import ContinuousActorProbabilistic, ContinuousCritic
from tianshou.utils.net.discrete import DiscreteActor, DiscreteCritic
from torch import nn

ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU}


def cartpole_envs(n: int, seed: int) -> DummyVectorEnv:
    envs = DummyVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(n)])
    envs.seed(seed)
    return envs


def ppo_algorithm(row: dict, env: gym.Env, pixels: bool) -> PPO:
    actions = env.action_space.n
    if pixels:  # the Nature CNN shared by policy and value, as Tianshou's Atari PPO
        from tianshou.env.atari.atari_network import DQNet, ScaledObsInputActionReprNet

        net = ScaledObsInputActionReprNet(
            DQNet(
                c=4,
                h=84,
                w=84,
                action_shape=actions,
                features_only=True,
                output_dim_added_layer=512,
            )  # fmt: skip
        )
        actor = DiscreteActor(preprocess_net=net, action_shape=actions, softmax_output=False)
        critic = DiscreteCritic(preprocess_net=net)
    else:  # separate actor and critic networks
        act = ACTIVATIONS[row["activation"]]
        shape = env.observation_space.shape
        actor = DiscreteActor(
            preprocess_net=Net(state_shape=shape, hidden_sizes=row["hidden"], activation=act),
            action_shape=actions, softmax_output=False,
        )  # fmt: skip
        critic = DiscreteCritic(
            preprocess_net=Net(state_shape=shape, hidden_sizes=row["hidden"], activation=act)
        )
    policy = DiscreteActorPolicy(actor=actor, action_space=env.action_space,
                                 deterministic_eval=True)  # fmt: skip
    return PPO(
        policy=policy, critic=critic, optim=AdamOptimizerFactory(lr=row["lr"], eps=1e-5),
        eps_clip=row["clip_eps"], vf_coef=row["vf_coef"], ent_coef=row["ent_coef"],
        max_grad_norm=row["max_grad_norm"], gae_lambda=row["gae_lambda"], gamma=row["gamma"],
        advantage_normalization=True, max_batchsize=row["minibatch_size"],
    )  # fmt: skip


def run_ppo(row: dict, seed: int, mode: str, pixels: bool) -> dict:
    torch.manual_seed(seed)
    np.random.seed(seed)
    if pixels:
        import ale_py
        from tianshou.env.atari.atari_wrapper import make_atari_env

        gym.register_envs(ale_py)
        env, envs, _ = make_atari_env(row["env"], seed, row["num_envs"], 1, scale=False)
    else:
        env, envs = gym.make("CartPole-v1"), cartpole_envs(row["num_envs"], seed)
    algorithm = ppo_algorithm(row, env, pixels)
    batch = row["num_envs"] * row["num_steps"]
    collector = Collector[CollectStats](algorithm, envs, VectorReplayBuffer(batch, len(envs)))
    params = {
        "training_collector": collector, "collection_step_num_env_steps": batch,
        "update_step_num_repetitions": row["num_epochs"], "batch_size": row["minibatch_size"],
        "show_progress": False, "verbose": False,
    }  # fmt: skip
    if mode == "solve":
        tests = cartpole_envs(EVAL_EPISODES, EVAL_SEED)
        result = algorithm.run_training(OnPolicyTrainerParams(
            **params, test_collector=Collector[CollectStats](algorithm, tests),
            test_step_num_episodes=EVAL_EPISODES, epoch_num_steps=row["eval_every"],
            max_epochs=math.ceil(row["solve_budget"] / row["eval_every"]),
            stop_fn=lambda mean: mean >= row["solve_return"],
        ))  # fmt: skip
        solved = result.best_reward >= row["solve_return"]
        return {"solved": bool(solved), "solve_s": result.timing.train_time,
                "solve_steps": result.train_step}  # fmt: skip
    if pixels:  # one untimed iteration first: lazy set-up, as for every library
        collector.reset()
        collector.collect(n_step=batch)
        collector.reset_buffer(keep_statistics=True)
    result = algorithm.run_training(OnPolicyTrainerParams(
        **params, max_epochs=1, epoch_num_steps=row["throughput_steps"], test_collector=None,
    ))  # fmt: skip
    return {"env_steps_per_s": result.train_step / result.timing.train_time,
            "env_steps": result.train_step}  # fmt: skip


def run_sac(row: dict, seed: int) -> dict:
    torch.manual_seed(seed)
    env = gym.make(row["env"])
    envs = DummyVectorEnv([lambda: gym.make(row["env"])])
    envs.seed(seed)
    obs_shape, action_shape = env.observation_space.shape, env.action_space.shape
    actor = ContinuousActorProbabilistic(
        preprocess_net=Net(state_shape=obs_shape, hidden_sizes=row["hidden"]),
        action_shape=action_shape, unbounded=True, conditioned_sigma=True,
    )  # fmt: skip

    def critic() -> ContinuousCritic:
        return ContinuousCritic(preprocess_net=Net(
            state_shape=obs_shape, action_shape=action_shape, hidden_sizes=row["hidden"],
            concat=True,
        ))  # fmt: skip

    alpha = AutoAlpha(-float(np.prod(action_shape)), 0.0, AdamOptimizerFactory(lr=row["lr"]))
    algorithm = SAC(
        policy=SACPolicy(actor=actor, action_space=env.action_space),
        policy_optim=AdamOptimizerFactory(lr=row["lr"]), critic=critic(),
        critic_optim=AdamOptimizerFactory(lr=row["lr"]), critic2=critic(),
        critic2_optim=AdamOptimizerFactory(lr=row["lr"]), tau=row["tau"], gamma=row["gamma"],
        alpha=alpha,
    )  # fmt: skip
    collector = Collector[CollectStats](algorithm, envs, ReplayBuffer(row["buffer_size"]),
                                        exploration_noise=True)  # fmt: skip
    collector.reset()
    collector.collect(n_step=row["learning_starts"], random=True)
    result = algorithm.run_training(OffPolicyTrainerParams(
        training_collector=collector, max_epochs=1, epoch_num_steps=row["timed_updates"],
        collection_step_num_env_steps=1, update_step_num_gradient_steps_per_sample=1.0,
        batch_size=row["batch_size"], test_collector=None, show_progress=False, verbose=False,
    ))  # fmt: skip
    return {"updates_per_s": result.update_step / result.timing.train_time,
            "updates": result.update_step}  # fmt: skip


def run_dqn(row: dict, seed: int, mode: str) -> dict:
    torch.manual_seed(seed)
    np.random.seed(seed)
    env, envs = gym.make("CartPole-v1"), cartpole_envs(1, seed)
    net = Net(state_shape=env.observation_space.shape, action_shape=env.action_space.n,
              hidden_sizes=row["hidden"])  # fmt: skip
    policy = DiscreteQLearningPolicy(model=net, action_space=env.action_space,
                                     eps_training=1.0, eps_inference=0.0)  # fmt: skip
    algorithm = DQN(
        policy=policy, optim=AdamOptimizerFactory(lr=row["lr"]), gamma=row["gamma"],
        target_update_freq=row["target_update_gradient_steps"], huber_loss_delta=1.0,
    )  # fmt: skip
    total = row["solve_budget"] if mode == "solve" else row["throughput_steps"]
    explore = row["exploration_fraction"] * total
    final = row["exploration_final_eps"]

    def training_fn(epoch: int, env_step: int) -> None:  # the zoo's linear epsilon
        policy.set_eps_training(max(final, 1.0 - (1.0 - final) * env_step / explore))

    collector = Collector[CollectStats](algorithm, envs, ReplayBuffer(row["buffer_size"]),
                                        exploration_noise=True)  # fmt: skip
    collector.reset()
    collector.collect(n_step=row["learning_starts"], random=True)
    params = {
        "training_collector": collector, "collection_step_num_env_steps": row["train_freq"],
        "update_step_num_gradient_steps_per_sample": row["gradient_steps"] / row["train_freq"],
        "batch_size": row["batch_size"], "training_fn": training_fn, "show_progress": False,
        "verbose": False,
    }  # fmt: skip
    if mode == "solve":
        tests = cartpole_envs(EVAL_EPISODES, EVAL_SEED)
        result = algorithm.run_training(OffPolicyTrainerParams(
            **params, test_collector=Collector[CollectStats](algorithm, tests),
            test_step_num_episodes=EVAL_EPISODES, epoch_num_steps=row["eval_every"],
            max_epochs=math.ceil((total - row["learning_starts"]) / row["eval_every"]),
            stop_fn=lambda mean: mean >= row["solve_return"],
        ))  # fmt: skip
        return {"solved": bool(result.best_reward >= row["solve_return"]),
                "solve_s": result.timing.train_time,
                "solve_steps": result.train_step + row["learning_starts"]}  # fmt: skip
    result = algorithm.run_training(OffPolicyTrainerParams(
        **params, max_epochs=1, epoch_num_steps=total - row["learning_starts"], test_collector=None,
    ))  # fmt: skip
    steps = result.train_step + row["learning_starts"]
    return {"env_steps_per_s": steps / result.timing.train_time, "env_steps": steps}


if __name__ == "__main__":
    side_main(__doc__, run_ppo, run_sac, run_dqn, lambda: __import__("tianshou").__version__)
