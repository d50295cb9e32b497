"""The gradient of an MLP actor-critic, derived by hand: the fast path of PPO's and A2C's updates.

On the small networks of control tasks (a 64x64 MLP, a few hundred samples) a training step's
cost is mostly per-operation overhead, not arithmetic: autograd records and replays dozens of
nodes, each a tensor op plus bookkeeping that outweighs the matmuls between them. The losses
of PPO and A2C depend on the network only through three per-sample quantities: the
log-probability of the taken action, the policy's entropy and the value. So the step splits:

1. `DirectGradActorCritic.outputs` runs the network without autograd, keeping what the backward
   pass needs, and returns ``log_prob``, ``entropy`` and ``values``.
2. The learner evaluates its losses on them with the usual pure functions (`shoal.losses`, for
   the logged values and the NaN check) and their gradients with respect to the three
   quantities from `shoal.losses.gradients`.
3. `DirectGradActorCritic.backward` carries those gradients through the distribution, the heads
   and the hidden layers with the chain rule written out, into each parameter's ``.grad``.

The result equals autograd's to float32 rounding (``tests/nn/test_direct_grad.py`` compares
every parameter's gradient for each supported model); a PPO gradient step takes about 0.75x the
time. `DirectGradActorCritic.supports` says which models qualify: `ActorCritic` with separate
MLP trunks (`ParallelMLP`) or a shared one (`MLP`), tanh or ReLU, and a categorical (any
temperature) or diagonal-Gaussian head. Everything else (image encoders, recurrent cores, a
critic-only observation part, other activations) trains through autograd as before.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from shoal.nn.activations import ACTIVATIONS
from shoal.nn.actor_critic import ActorCritic
from shoal.nn.distributions import LOG_SQRT_2PI
from shoal.nn.heads import CategoricalHead, GaussianHead
from shoal.nn.mlp import MLP, ParallelMLP

# Each activation's backward from its output y, as one fused op (autograd's own kernels):
# tanh: grad * (1 - y^2); relu: grad * [y > 0].
_BACKWARD_FROM_OUTPUT = {
    ACTIVATIONS["tanh"]: torch.ops.aten.tanh_backward,
    ACTIVATIONS["relu"]: lambda grad, y: torch.ops.aten.threshold_backward(grad, y, 0),
}


class Outputs(NamedTuple):
    """The per-sample quantities the on-policy losses read, ``[N]`` each, plus what the
    hand-written backward pass needs (``saved``: each layer's output, the distribution's
    intermediate values)."""

    log_prob: Tensor
    entropy: Tensor
    values: Tensor
    saved: tuple


class DirectGradActorCritic:
    """Forward pass without autograd and a hand-derived backward pass for ``model``."""

    @staticmethod
    def supports(model: torch.nn.Module) -> bool:
        if type(model) is not ActorCritic or model.split is not None:
            return False
        body = model.body
        if type(body) not in (MLP, ParallelMLP) or body.activation not in _BACKWARD_FROM_OUTPUT:
            return False
        if type(body) is ParallelMLP and body.members != 2:
            return False
        return type(model.policy_head) in (CategoricalHead, GaussianHead)

    @classmethod
    def for_model(cls, model: torch.nn.Module) -> DirectGradActorCritic | None:
        """The direct path for ``model``, or None when it needs autograd."""
        return cls(model) if cls.supports(model) else None

    def __init__(self, model: ActorCritic):
        if not self.supports(model):
            raise ValueError(f"{type(model).__name__} has no hand-derived gradient")
        self.model = model
        self.parallel = isinstance(model.body, ParallelMLP)
        self.activation_backward = _BACKWARD_FROM_OUTPUT[model.body.activation]
        self.categorical = isinstance(model.policy_head, CategoricalHead)

    def _layers(self) -> list[tuple[Tensor, Tensor]]:
        """``(weight, bias)`` of each hidden layer, weights as ``[in, out]`` (``[2, in, out]``
        for separate trunks) so that a layer is ``x @ weight + bias``."""
        body = self.model.body
        if self.parallel:
            return list(zip(body.weights, body.biases, strict=True))
        return [(layer.weight.T, layer.bias) for layer in body.layers]

    @torch.no_grad()
    def outputs(self, obs: Tensor, actions: Tensor) -> Outputs:
        model = self.model
        x = model.encoding(obs)
        h = x.expand(2, *x.shape) if self.parallel else x
        hidden = [h]
        for weight, bias in self._layers():
            h = torch.baddbmm(bias, h, weight) if self.parallel else torch.addmm(bias, h, weight)
            h = model.body.activation(h)
            hidden.append(h)
        actor, critic = h.unbind(0) if self.parallel else (h, h)
        values = model.value_head(critic)
        if self.categorical:
            head = model.policy_head
            logits = head.logits(actor) / head.temperature  # exact at temperature 1
            log_probs = torch.log_softmax(logits, dim=-1)
            probs = log_probs.exp()
            log_prob = log_probs.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
            entropy = -(probs * log_probs).sum(-1)
            distribution = (log_probs, probs, actions.long(), entropy)
        else:
            log_std = model.policy_head.log_std
            inv_std = torch.exp(-log_std)
            z = (actions - model.policy_head.mean(actor)) * inv_std
            log_prob = (-0.5 * z.square() - log_std).sum(-1) - z.shape[-1] * LOG_SQRT_2PI
            entropy = (log_std + 0.5 + LOG_SQRT_2PI).sum(-1).expand(z.shape[0])
            distribution = (z, inv_std)
        return Outputs(log_prob, entropy, values, saved=(hidden, distribution))

    @torch.no_grad()
    def backward(
        self, outputs: Outputs, g_log_prob: Tensor, g_entropy: Tensor | None, g_values: Tensor
    ) -> None:
        """Set each parameter's ``.grad`` to the gradient of a loss whose gradients with
        respect to ``outputs.log_prob``, ``.entropy`` and ``.values`` are the ``g_`` tensors
        (``g_entropy`` None: the loss has no entropy term)."""
        model = self.model
        hidden, distribution = outputs.saved
        features = hidden[-1]
        actor, critic = features.unbind(0) if self.parallel else (features, features)

        # Value head: values = critic @ w.T + b.
        value = model.value_head.value
        value.weight.grad = (g_values @ critic).unsqueeze(0)
        value.bias.grad = g_values.sum().reshape(1)
        g_critic = g_values.unsqueeze(-1) * value.weight

        if self.categorical:
            g_actor = self._categorical_backward(actor, distribution, g_log_prob, g_entropy)
        else:
            g_actor = self._gaussian_backward(actor, distribution, g_log_prob, g_entropy)

        # Hidden layers, last to first: h_out = act(h_in @ weight + bias).
        g_h = torch.stack([g_actor, g_critic]) if self.parallel else g_actor + g_critic
        layers = self._layers()
        for index in range(len(layers) - 1, -1, -1):
            weight, bias = layers[index]
            g_pre = self.activation_backward(g_h, hidden[index + 1])
            h_in = hidden[index]
            if self.parallel:
                weight.grad = torch.bmm(h_in.transpose(1, 2), g_pre)
                bias.grad = g_pre.sum(1, keepdim=True)
            else:
                model.body.layers[index].weight.grad = g_pre.T @ h_in
                bias.grad = g_pre.sum(0)
            if index > 0:
                g_h = (
                    torch.bmm(g_pre, weight.transpose(1, 2)) if self.parallel else g_pre @ weight.T
                )

    def _categorical_backward(
        self, actor: Tensor, distribution: tuple, g_log_prob: Tensor, g_entropy: Tensor | None
    ) -> Tensor:
        """Through log_softmax, the entropy and the (tempered) logits layer; returns the
        gradient on the actor's features."""
        head = self.model.policy_head
        log_probs, probs, actions, entropy = distribution
        # d log p_a / d logit_k = [k = a] - p_k;  d H / d logit_k = -p_k (log p_k + H).
        g_per_prob = g_log_prob.unsqueeze(-1)
        if g_entropy is not None:
            g_per_prob = g_per_prob + g_entropy.unsqueeze(-1) * (log_probs + entropy.unsqueeze(-1))
        g_logits = -probs * g_per_prob
        g_logits.scatter_add_(-1, actions.unsqueeze(-1), g_log_prob.unsqueeze(-1))
        g_logits = g_logits / head.temperature
        head.logits.weight.grad = g_logits.T @ actor
        head.logits.bias.grad = g_logits.sum(0)
        return g_logits @ head.logits.weight

    def _gaussian_backward(
        self, actor: Tensor, distribution: tuple, g_log_prob: Tensor, g_entropy: Tensor | None
    ) -> Tensor:
        """Through the diagonal Gaussian's log-density and entropy and the mean layer."""
        head = self.model.policy_head
        z, inv_std = distribution
        # log p = sum(-z^2 / 2 - log_std) - c with z = (a - mean) / std:
        # d log p / d mean = z / std;  d log p / d log_std = z^2 - 1;  d H / d log_std = 1.
        g_mean = g_log_prob.unsqueeze(-1) * z * inv_std
        head.log_std.grad = g_log_prob @ (z.square() - 1.0)
        if g_entropy is not None:
            head.log_std.grad += g_entropy.sum()
        head.mean.weight.grad = g_mean.T @ actor
        head.mean.bias.grad = g_mean.sum(0)
        return g_mean @ head.mean.weight
