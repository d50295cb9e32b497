"""Small runs of learner groups (``run.learners`` > 1) for the tests on Ray
(tests/distributed/test_learner_group.py) and on forked ranks (tests/algos/test_learner_groups.py):
the settings, an algorithm seeded as the training loop seeds it, iterations with a kill or a
saved state on the way, and the offline bandit."""

import copy

import gymnasium as gym
import numpy as np
import torch

from shoal.core.seeding import rng_state
from shoal.data.offline import Episode, write_dataset
from shoal.registry import ALGORITHMS

SMALL = {
    "env.id": "CartPole-v1",
    "env.num_envs": 4,
    "num_steps": 16,
    "model.hidden": (16,),
    "run.learners": 2,
    "run.seed": 3,
}
PPO = {"minibatch_size": 32, "num_epochs": 2}
QUIET = {
    "run.eval_every_steps": 0,
    "run.console": False,
    "run.tensorboard": False,
}


DQN = {
    "env.num_envs": 2,
    "rollout_steps": 4,
    "model.hidden": (32,),
    "replay.batch_size": 16,
    "replay.learning_starts": 8,
    "replay.gradient_steps": 4,
    "replay.prioritized": "proportional",
    "replay.n_step": 2,
    "target_update_every": 5,
    "replay.save": True,
}
"""Four updates per iteration; priorities written back from the group's."""


R2D2 = {"num_steps": 8, "burn_in": 2, "length": 4, "period": 2, "model.lstm_hidden": 8,
        "replay.batch_size": 8, "replay.learning_starts": 8, "replay.gradient_steps": 2,
        "replay.save": True}  # fmt: skip
"""Sequences learned from the second iteration on, two updates each."""
QMIX = {"env.id": "shoal/two-step-v0", "env.num_envs": 8, "rollout_steps": 2,
        "replay.batch_size": 4, "replay.learning_starts": 4, "replay.buffer_size": 64,
        "replay.gradient_steps": 2, "target_update_every": 3, "rnn_hidden": 8,
        "mixing_embed_dim": 4, "replay.save": True}  # fmt: skip
"""Episodes learned from the first iteration on, two updates each."""
MADDPG = {"env.id": "shoal/spread-v0", "rollout_steps": 2, "replay.gradient_steps": 2,
          "replay.batch_size": 16, "replay.learning_starts": 8, "replay.buffer_size": 400,
          "replay.save": True}  # fmt: skip
"""Joint steps learned from the second iteration on, two updates each."""
CTEDD = {"env.id": "shoal/cn-v1-v0", "rollout_steps": 2, "replay.gradient_steps": 2,
         "replay.batch_size": 16, "replay.learning_starts": 8, "replay.buffer_size": 400,
         "global_hidden": (8,), "local_hidden": (8,), "distill_every": 16,
         "distill_batch_size": 8, "distill_repeats": 2, "replay.save": True}  # fmt: skip
"""Stage 1 from the second iteration on (an exploration update and two updates each), a
distillation round every other iteration."""
ACER = {"replay.learning_starts": 64, "replay.replay_ratio": 2.0, "replay.save": True}
"""Replayed segments from the second iteration on (Poisson draws of them)."""
TRPO = {"vf_minibatch_size": 24, "vf_epochs": 2}
"""Value regression minibatches of 24 of the 64 steps (the last one 16)."""
ALPHAZERO = {"env.id": "openspiel:tic_tac_toe", "search.num_simulations": 4,
             "moves_per_iteration": 4, "min_replay": 16, "batch_size": 16,
             "updates_per_iteration": 2, "channels": 8, "eval_every": 0}  # fmt: skip
MUZERO = {"search.num_simulations": 4, "steps_per_iteration": 4, "min_replay": 16,
          "batch_size": 16, "updates_per_iteration": 2, "unroll_steps": 3, "n_step": 5,
          "latent": 8, "eval_every": 0}  # fmt: skip
"""Self-play of tic-tac-toe games and CartPole episodes; two updates an iteration once the
replay holds 16 positions."""
APPO = {"ppo.num_steps": 16, "ppo.model.hidden": (16,), "ppo.minibatch_size": 32,
        "ppo.num_epochs": 2}  # fmt: skip
"""PPO's settings of APPO's learner (its sampler thread runs one rollout ahead)."""


def build(name="ppo", **settings):
    """The algorithm seeded as the training loop seeds it."""
    spec = ALGORITHMS[name]
    extra = {"ppo": PPO, "dqn": DQN, "appo": APPO, "r2d2": R2D2, "qmix": QMIX, "trpo": TRPO,
             "maddpg": MADDPG, "acer": ACER, "ctedd": CTEDD, "alphazero": ALPHAZERO,
             "muzero": MUZERO}.get(name, {})  # fmt: skip
    multi_agent = ("env.id", "num_steps")
    own = {"dqn": ("num_steps",), "appo": ("num_steps", "model.hidden"), "qmix": multi_agent,
           "maddpg": multi_agent, "ctedd": multi_agent, "alphazero": multi_agent,
           "muzero": ("num_steps",)}.get(name, ())  # fmt: skip
    small = {k: v for k, v in SMALL.items() if k not in own}
    config = spec.default_config(**{**small, **extra, **settings})
    torch.manual_seed(11)
    return spec.algorithm_cls(config)


def weights(algo):
    learner = algo.learner
    if hasattr(learner, "online"):  # QMIX's networks
        return {k: v.clone() for k, v in learner.online.state_dict().items()}
    if hasattr(algo, "students"):  # CTEDD's: the global policies, scales, critics, students
        student = algo.students[algo.config.message_dim]
        state = {**algo.learner.state_dict(), "students": student.state_dict()}
        state.pop("group_rng", None)  # a group's, not the learner's
        return {k: v.clone() for k, v in flat_tensors(state)}
    return {k: v.clone() for k, v in learner.get_weights().items()}


def flat_tensors(state, prefix=""):
    """The tensors of a nested state dict by dotted key (optimizer state included)."""
    if isinstance(state, torch.Tensor):
        yield prefix, state
    elif isinstance(state, dict):
        for k, v in state.items():
            yield from flat_tensors(v, f"{prefix}.{k}" if prefix else str(k))


def assert_same(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def run(algo, iterations, kill_at=None, save_at=None):
    """``iterations`` iterations; rank 1 killed before iteration ``kill_at``; the state (as a
    checkpoint holds it) and the torch generator taken after ``save_at`` of them."""
    saved = None
    try:
        for i in range(iterations):
            if i == kill_at:
                algo.learner.kill(1)
            metrics = algo.train_iteration()
            if i + 1 == save_at:
                # as a checkpoint holds them: copies (the state holds views of live tensors)
                saved = copy.deepcopy(algo.state_dict()), rng_state()
        return weights(algo), metrics, saved
    finally:
        algo.close()


def kill_during(algo, update, rank=1):
    """Kill rank ``rank`` just before the group's ``update``-th update (counted from now)."""
    group, calls = algo.learner, 0
    original = group.update

    def killing(batch):
        nonlocal calls
        calls += 1
        if calls == update:
            group.kill(rank)
        return original(batch)

    group.update = killing


def bandit(directory, size=3000):
    """One-step episodes of uniformly random actions: action 1 pays 1 where obs[0] > 0,
    action 0 elsewhere (tests/algos/test_offline.py's bandit)."""
    rng = np.random.default_rng(0)
    obs = rng.uniform(-1, 1, (size, 2, 4)).astype(np.float32)
    right = (obs[:, 0, 0] > 0).astype(np.int64)
    actions = rng.integers(0, 2, size)
    episodes = [Episode(o, a[None], np.float32([a == r]), np.array([True]), np.array([False]))
                for o, a, r in zip(obs, actions, right, strict=True)]  # fmt: skip
    write_dataset(directory, episodes, gym.spaces.Box(-1, 1, (4,), np.float32),
                  gym.spaces.Discrete(2), {"id": "bandit"})  # fmt: skip
    return str(directory)


CQL_GROUP = {
    "run.learners": 2, "run.eval_every_steps": 0, "model.hidden": (32, 32),
    "replay.batch_size": 64, "optim.lr": 1e-3, "actor_lr": 1e-3, "conservative_weight": 1.0,
}  # fmt: skip
