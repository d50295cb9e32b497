"""Pure loss and return functions: tensors in, tensors out, no state."""

from shoal.losses.policy_gradient import (
    adaptive_kl_coeff,
    entropy_loss,
    kl_penalty_loss,
    policy_gradient_loss,
    ppo_clip_loss,
)
from shoal.losses.returns import discounted_returns, gae
from shoal.losses.value import clipped_value_loss, huber_loss, value_loss

__all__ = [
    "adaptive_kl_coeff",
    "clipped_value_loss",
    "discounted_returns",
    "entropy_loss",
    "gae",
    "huber_loss",
    "kl_penalty_loss",
    "policy_gradient_loss",
    "ppo_clip_loss",
    "value_loss",
]
