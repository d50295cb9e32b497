"""Networks: encoders, heads, distributions and weight initialization."""

from shoal.nn.actor_critic import ActorCritic, ActOutput, ObsEncoding
from shoal.nn.distributions import Categorical, DiagGaussian
from shoal.nn.heads import CategoricalHead, GaussianHead, ValueHead
from shoal.nn.init import init_linear, linear
from shoal.nn.mlp import MLP
from shoal.nn.q_heads import NoisyLinear, QHead
from shoal.nn.recurrent import RecurrentActorCritic, build_actor_critic, is_recurrent

__all__ = [
    "MLP",
    "ActOutput",
    "ActorCritic",
    "Categorical",
    "CategoricalHead",
    "DiagGaussian",
    "GaussianHead",
    "NoisyLinear",
    "ObsEncoding",
    "QHead",
    "RecurrentActorCritic",
    "ValueHead",
    "build_actor_critic",
    "init_linear",
    "is_recurrent",
    "linear",
]
