"""TorchRL side of ``benchmarks/peers.py``: one row, one seed, one JSON line.

Written as TorchRL's own examples (``sota-implementations``) train: a collector over a
``GymEnv`` (or its ``ParallelEnv`` Atari pipeline), ``GAE`` + ``ClipPPOLoss``, ``SACLoss``
with ``SoftUpdate``, ``DQNLoss`` with ``HardUpdate``, ``TensorDictReplayBuffer``s; with the
settings of ``peer_settings.ROWS``. GAE runs once per PPO iteration (shoal, SB3 and CleanRL do
the same; TorchRL's Atari example recomputes it every epoch). Runs in ``.venv-torchrl``.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from peer_settings import Solver, side_main
from tensordict.nn import TensorDictModule, TensorDictSequential
from tensordict.nn.distributions import NormalParamExtractor
from torch import nn
from torchrl.collectors import Collector
from torchrl.data import LazyTensorStorage, SamplerWithoutReplacement, TensorDictReplayBuffer
from torchrl.envs import (
    DoubleToFloat,
    EnvCreator,
    ExplorationType,
    GymEnv,
    GymWrapper,
    ParallelEnv,
    TransformedEnv,
    set_exploration_type,
)
from torchrl.modules import (
    MLP,
    ConvNet,
    EGreedyModule,
    ProbabilisticActor,
    QValueActor,
    TanhNormal,
    ValueOperator,
)
from torchrl.objectives import ClipPPOLoss, DQNLoss, HardUpdate, SACLoss, SoftUpdate
from torchrl.objectives.value import GAE

ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU}


class Scale(nn.Module):
    """uint8 frames to floats in [0, 1]."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.float() / 255.0


def cartpole_env(num_envs: int, seed: int):
    env = GymEnv("CartPole-v1", num_envs=num_envs, categorical_action_encoding=True)
    env.set_seed(seed)
    return TransformedEnv(env, DoubleToFloat())


def pong_env(num_envs: int, seed: int):
    """Pong with Gymnasium's DeepMind preprocessing (no-op resets, frame skip 4 with
    max-pooling, grayscale 84x84; torchvision, which TorchRL's own Resize needs, does not
    install beside this torch) and 4 stacked frames, in TorchRL's ParallelEnv as its Atari
    example runs them."""

    def base():
        import ale_py
        import gymnasium as gym

        gym.register_envs(ale_py)
        env = gym.make("PongNoFrameskip-v4")
        env = gym.wrappers.AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=84)
        return GymWrapper(gym.wrappers.FrameStackObservation(env, 4),
                          categorical_action_encoding=True)  # fmt: skip

    env = ParallelEnv(num_envs, EnvCreator(base), serial_for_single=True)
    env.set_seed(seed)
    return env


def ppo_modules(env, row: dict, pixels: bool):
    actions = env.action_spec_unbatched.space.n
    key = "observation"
    if pixels:  # the Nature CNN shared by policy and value, as TorchRL's Atari example
        trunk = nn.Sequential(
            Scale(),
            ConvNet(activation_class=nn.ReLU, num_cells=[32, 64, 64], kernel_sizes=[8, 4, 3],
                    strides=[4, 2, 1]),
            nn.Linear(3136, 512), nn.ReLU(),
        )  # fmt: skip
        common = TensorDictModule(trunk, in_keys=[key], out_keys=["features"])
        policy = ProbabilisticActor(
            TensorDictSequential(common, TensorDictModule(nn.Linear(512, actions),
                                                          ["features"], ["logits"])),
            in_keys=["logits"], distribution_class=torch.distributions.Categorical,
            return_log_prob=True, spec=env.full_action_spec_unbatched,
        )  # fmt: skip
        value = TensorDictSequential(
            common, TensorDictModule(nn.Linear(512, 1), ["features"], ["state_value"])
        )
        return policy, value
    act = ACTIVATIONS[row["activation"]]
    logits = MLP(out_features=actions, num_cells=row["hidden"], activation_class=act)
    policy = ProbabilisticActor(
        TensorDictModule(logits, in_keys=[key], out_keys=["logits"]), in_keys=["logits"],
        distribution_class=torch.distributions.Categorical, return_log_prob=True,
        spec=env.full_action_spec_unbatched,
    )  # fmt: skip
    value = ValueOperator(MLP(out_features=1, num_cells=row["hidden"], activation_class=act),
                          in_keys=[key])  # fmt: skip
    with torch.no_grad():
        policy(env.fake_tensordict())
        value(env.fake_tensordict())
    return policy, value


def run_ppo(row: dict, seed: int, mode: str, pixels: bool) -> dict:
    torch.manual_seed(seed)
    env = (pong_env if pixels else cartpole_env)(row["num_envs"], seed)
    policy, value = ppo_modules(env, row, pixels)
    batch = row["num_envs"] * row["num_steps"]
    total = row["solve_budget"] if mode == "solve" else row["throughput_steps"]
    warmup = row.get("warmup_steps", 0)
    collector = Collector(env, policy, frames_per_batch=batch, total_frames=total + warmup)
    advantage = GAE(gamma=row["gamma"], lmbda=row["gae_lambda"], value_network=value,
                    average_gae=False)  # fmt: skip
    loss = ClipPPOLoss(policy, value, clip_epsilon=row["clip_eps"], entropy_coeff=row["ent_coef"],
                       critic_coeff=row["vf_coef"], loss_critic_type="l2",
                       normalize_advantage=True)  # fmt: skip
    optim = torch.optim.Adam(loss.parameters(), lr=row["lr"], eps=1e-5)
    buffer = TensorDictReplayBuffer(storage=LazyTensorStorage(batch),
                                    sampler=SamplerWithoutReplacement(),
                                    batch_size=row["minibatch_size"])  # fmt: skip

    def act(obs: np.ndarray) -> np.ndarray:
        from tensordict import TensorDict

        with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
            td = TensorDict({"observation": torch.as_tensor(obs, dtype=torch.float32)},
                            batch_size=[len(obs)])  # fmt: skip
            return policy(td)["action"].numpy()

    solver = Solver(row, act) if mode == "solve" else None
    steps, start = 0, None
    for data in collector:
        if steps >= warmup and start is None:
            start = time.perf_counter()  # after the warm-up iterations (lazy set-up)
            if solver is not None:
                solver.clock.start = start
        with torch.no_grad():
            advantage(data)
        buffer.extend(data.reshape(-1))
        for _ in range(row["num_epochs"]):
            for minibatch in buffer:
                out = loss(minibatch)
                total_loss = out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]
                optim.zero_grad()
                total_loss.backward()
                nn.utils.clip_grad_norm_(loss.parameters(), row["max_grad_norm"])
                optim.step()
        collector.update_policy_weights_()
        steps += data.numel()
        if solver is not None and solver.check(steps):
            break
    collector.shutdown()
    if solver is not None:
        return solver.result(steps)
    seconds = time.perf_counter() - start
    return {"env_steps_per_s": (steps - warmup) / seconds, "env_steps": steps - warmup}


def run_sac(row: dict, seed: int) -> dict:
    torch.manual_seed(seed)
    env = TransformedEnv(GymEnv(row["env"]), DoubleToFloat())
    env.set_seed(seed)
    spec = env.action_spec_unbatched
    actor_net = nn.Sequential(
        MLP(num_cells=row["hidden"], out_features=2 * spec.shape[-1], activation_class=nn.ReLU),
        NormalParamExtractor(),
    )  # fmt: skip
    actor = ProbabilisticActor(
        TensorDictModule(actor_net, in_keys=["observation"], out_keys=["loc", "scale"]),
        in_keys=["loc", "scale"], spec=spec, distribution_class=TanhNormal,
        distribution_kwargs={"low": spec.space.low, "high": spec.space.high},
        default_interaction_type=ExplorationType.RANDOM, return_log_prob=False,
    )  # fmt: skip
    qvalue = ValueOperator(MLP(num_cells=row["hidden"], out_features=1, activation_class=nn.ReLU),
                           in_keys=["observation", "action"])  # fmt: skip
    with torch.no_grad():
        td = env.fake_tensordict()
        actor(td)
        qvalue(td)
    loss = SACLoss(actor, qvalue, num_qvalue_nets=2, loss_function="l2",
                   delay_actor=False, delay_qvalue=True, alpha_init=1.0)  # fmt: skip
    loss.make_value_estimator(gamma=row["gamma"])
    target = SoftUpdate(loss, eps=1 - row["tau"])
    optim = torch.optim.Adam(loss.parameters(), lr=row["lr"])
    buffer = TensorDictReplayBuffer(storage=LazyTensorStorage(row["buffer_size"]),
                                    batch_size=row["batch_size"])  # fmt: skip
    starts, timed = row["learning_starts"], row["timed_updates"]
    collector = Collector(env, actor, frames_per_batch=1, total_frames=starts + timed,
                          init_random_frames=starts)  # fmt: skip
    updates, start = 0, None
    for i, data in enumerate(collector):
        buffer.extend(data.reshape(-1))
        if i + 1 < starts:
            continue
        if start is None:
            start = time.perf_counter()
        sample = buffer.sample()
        out = loss(sample)
        total_loss = out["loss_actor"] + out["loss_qvalue"] + out["loss_alpha"]
        optim.zero_grad()
        total_loss.backward()
        optim.step()
        target.step()
        updates += 1
    seconds = time.perf_counter() - start
    collector.shutdown()
    return {"updates_per_s": updates / seconds, "updates": updates}


def run_dqn(row: dict, seed: int, mode: str) -> dict:
    torch.manual_seed(seed)
    env = cartpole_env(1, seed)
    spec = env.action_spec_unbatched
    net = MLP(out_features=spec.space.n, num_cells=row["hidden"], activation_class=nn.ReLU)
    qnet = QValueActor(net, in_keys=["observation"], spec=spec)
    with torch.no_grad():
        qnet(env.fake_tensordict())
    total = row["solve_budget"] if mode == "solve" else row["throughput_steps"]
    explore_steps = int(row["exploration_fraction"] * total)
    greedy = EGreedyModule(spec, eps_init=1.0, eps_end=row["exploration_final_eps"],
                           annealing_num_steps=explore_steps)  # fmt: skip
    explorer = TensorDictSequential(qnet, greedy)
    loss = DQNLoss(qnet, loss_function="smooth_l1", delay_value=True)
    loss.make_value_estimator(gamma=row["gamma"])
    target = HardUpdate(loss, value_network_update_interval=row["target_update_gradient_steps"])
    optim = torch.optim.Adam(loss.parameters(), lr=row["lr"])
    buffer = TensorDictReplayBuffer(storage=LazyTensorStorage(row["buffer_size"]),
                                    batch_size=row["batch_size"])  # fmt: skip
    collector = Collector(env, explorer, frames_per_batch=row["train_freq"], total_frames=total,
                          init_random_frames=row["learning_starts"])  # fmt: skip

    def act(obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return net(torch.as_tensor(obs, dtype=torch.float32)).argmax(-1).numpy()

    solver = Solver(row, act) if mode == "solve" else None
    start = time.perf_counter()
    if solver is not None:
        solver.clock.start = start
    steps = 0
    for data in collector:
        buffer.extend(data.reshape(-1))
        steps += data.numel()
        greedy.step(data.numel())
        if steps >= row["learning_starts"]:
            for _ in range(row["gradient_steps"]):
                out = loss(buffer.sample())
                optim.zero_grad()
                out["loss"].backward()
                nn.utils.clip_grad_norm_(loss.parameters(), row["max_grad_norm"])
                optim.step()
                target.step()
        collector.update_policy_weights_()
        if solver is not None and solver.check(steps):
            break
    collector.shutdown()
    if solver is not None:
        return solver.result(steps)
    return {"env_steps_per_s": steps / (time.perf_counter() - start), "env_steps": steps}


if __name__ == "__main__":
    side_main(__doc__, run_ppo, run_sac, run_dqn, lambda: __import__("torchrl").__version__)
