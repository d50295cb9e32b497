"""How far one optimizer step can move a policy logit, for Lamb et al.'s Model 2 and the
Nature CNN on Pong frames (issue 41, part 3: why A2C Model 2 collapsed at lr 7e-4).

RMSProp divides each gradient by its running root mean square, so once the squares have
settled a weight moves by about the learning rate per step whatever its gradient's scale. A
logit is ``w . f + b``: when the step's signs line up with the features', it moves by up to
``lr * sum_i |f_i|``. This prints ``sum_i |f_i|`` of the features each model's policy head
reads (batch-norm layers in training mode, as in the update), averaged over 80 frames of
random Pong play with Lamb et al.'s preprocessing (frame skip 4), and that bound at the
learning rates of the zoo (7e-4) and of Lamb et al. (1e-4): for Model 2 and the Nature CNN
the conv features, for Model 3 (``a2c-lstm-pong``) its LSTM's output over the 80 frames as
one sequence, divided by the softmax temperature it starts with (2.0).

Usage: ``python benchmarks/atari_head_step.py [--seed 0]`` (seconds; needs the atari extra).
"""

from __future__ import annotations

import argparse
import dataclasses

import gymnasium as gym
import numpy as np
import torch

from shoal.envs.atari import make_atari_env
from shoal.nn.cnn import build_encoder
from shoal.nn.recurrent import RecurrentActorCritic
from shoal.registry import find_tuned

RATES = (7e-4, 1e-4)


def frames(seed: int, count: int = 80, every: int = 5) -> torch.Tensor:
    """``count`` observations of random play, one every ``every`` steps."""
    env = make_atari_env("PongNoFrameskip-v4", "crop80-stack", frameskip=4)
    rng = np.random.default_rng(seed)
    env.reset(seed=seed)
    seen = []
    for _ in range(count * every):
        obs, _, terminated, truncated, _ = env.step(int(rng.integers(env.action_space.n)))
        seen.append(np.asarray(obs))
        if terminated or truncated:
            env.reset()
    env.close()
    return torch.from_numpy(np.stack(seen[::every]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    x = frames(args.seed)
    model = find_tuned("a2c-cnn-pong").build_config().model
    obs_space = make_atari_env("PongNoFrameskip-v4", "crop80-stack", frameskip=4).observation_space
    print("| encoder | features | sum of abs features | " +
          " | ".join(f"logit move per step at lr {lr:g}" for lr in RATES) + " |")  # fmt: skip
    print("|---|---|---|" + "---|" * len(RATES))
    rows = []
    for name in ("batchnorm-cnn2", "nature"):
        encoder = build_encoder(obs_space, dataclasses.replace(model, encoder=name)).train()
        with torch.no_grad():
            rows.append((name, encoder.out_dim, encoder(x).abs().sum(1).mean().item()))
    config = find_tuned("a2c-lstm-pong").build_config().model
    recurrent = RecurrentActorCritic(obs_space, gym.spaces.Discrete(6), config).train()
    with torch.no_grad():
        h, _ = recurrent(x.unsqueeze(1), recurrent.initial_state(1))  # one env, 80 steps
    size = h.abs().sum(-1).mean().item() / config.temperature
    rows.append(("batchnorm-cnn3-lstm, LSTM output / temperature", config.lstm_hidden, size))
    for name, width, size in rows:
        moves = " | ".join(f"{lr * size:.2f}" for lr in RATES)
        print(f"| {name} | {width} | {size:,.0f} | {moves} |")


if __name__ == "__main__":
    main()
