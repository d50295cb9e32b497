"""Users' encoders for the tests of ``model.encoder module:Class`` (`shoal.nn.custom`)."""

import numpy as np
import torch
from torch import nn


class TinyEncoder(nn.Module):
    """One linear layer and a ReLU over the flattened observation."""

    built: list = []  # every instance, with its constructor arguments

    def __init__(self, obs_space, config):
        super().__init__()
        self.args = (obs_space, config)
        self.layer = nn.Linear(int(np.prod(obs_space.shape)), 24)
        self.initial = self.layer.weight.detach().clone()  # not a parameter: stays as built
        self.out_dim = 24
        TinyEncoder.built.append(self)

    def forward(self, obs):
        return torch.relu(self.layer(obs.float().flatten(start_dim=1)))


class GoalLineEncoder(nn.Module):
    """Reads `shoal/GoalLine-v0`'s Dict observations through ``unpack_tensor``."""

    def __init__(self, obs_space, config):
        super().__init__()
        self.space = obs_space
        self.goal = nn.Embedding(obs_space.original["goal"].n, 8)
        self.mlp = nn.Sequential(nn.Linear(9, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh())
        self.out_dim = 64

    def forward(self, obs):
        parts = self.space.unpack_tensor(obs)
        return self.mlp(torch.cat([parts["pos"], self.goal(parts["goal"])], dim=-1))


class NoOutDim(nn.Module):
    def __init__(self, obs_space, config):
        super().__init__()


class Broken(nn.Module):
    def __init__(self, obs_space, config):
        raise ValueError("this encoder needs images")


class FloatOnly(nn.Module):
    """The README's example encoder: a linear layer over float observations, which cannot
    read a Dict space's packed uint8 records."""

    def __init__(self, obs_space, config):
        super().__init__()
        self.layer = nn.Linear(obs_space.shape[0], 16)
        self.out_dim = 16

    def forward(self, obs):
        return torch.relu(self.layer(obs))


class WrongWidth(FloatOnly):
    def forward(self, obs):
        return super().forward(obs)[:, :8]


class HalfTemperatureHead(nn.Module):
    """A categorical policy head of its own: logits at temperature 2."""

    def __init__(self, in_dim, action_space, config):
        super().__init__()
        self.logits = nn.Linear(in_dim, int(action_space.n))

    def forward(self, features):
        from shoal.nn.distributions import Categorical

        return Categorical(self.logits(features) / 2.0)
