"""Pure loss and return functions: tensors in, tensors out, no state."""

from shoal.losses.natural_gradient import (
    conjugate_gradient,
    fisher_vector_product,
    flat_concat,
    flat_grad,
    set_flat_params,
)
from shoal.losses.policy_gradient import (
    adaptive_kl_coeff,
    entropy_loss,
    kl_penalty_loss,
    policy_gradient_loss,
    ppo_clip_loss,
)
from shoal.losses.q_learning import (
    categorical_projection,
    categorical_td_loss,
    combine_heads,
    q_learning_target,
    quantile_huber_loss,
    quantile_midpoints,
    quantile_target,
    random_convex_combination,
    td_loss,
)
from shoal.losses.returns import (
    VTraceReturns,
    bootstrap_discount,
    discounted_returns,
    episode_returns,
    gae,
    n_step_return,
    vtrace,
)
from shoal.losses.value import clipped_value_loss, huber_loss, value_loss

__all__ = [
    "adaptive_kl_coeff",
    "bootstrap_discount",
    "categorical_projection",
    "categorical_td_loss",
    "clipped_value_loss",
    "combine_heads",
    "conjugate_gradient",
    "discounted_returns",
    "entropy_loss",
    "episode_returns",
    "fisher_vector_product",
    "flat_concat",
    "flat_grad",
    "gae",
    "huber_loss",
    "kl_penalty_loss",
    "n_step_return",
    "policy_gradient_loss",
    "ppo_clip_loss",
    "q_learning_target",
    "quantile_huber_loss",
    "quantile_midpoints",
    "quantile_target",
    "random_convex_combination",
    "set_flat_params",
    "td_loss",
    "value_loss",
    "vtrace",
    "VTraceReturns",
]
