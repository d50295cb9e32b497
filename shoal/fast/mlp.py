"""An MLP actor-critic's forward pass and hand-derived backward pass in NumPy.

On the small networks of control tasks (a 64x64 MLP, a few hundred samples) a training step's
cost is mostly per-operation overhead, not arithmetic: autograd records and replays dozens of
nodes, each a tensor op plus bookkeeping that outweighs the matmuls between them. The
on-policy losses depend on the network only through three per-sample outputs
(`shoal.losses.objectives.PolicyOutputs`: the taken action's log-probability, the policy's
entropy and the value), so a step splits:

1. `NumpyActorCritic.outputs` runs the network, keeping what the backward pass needs.
2. The objective gives the losses and their gradients with respect to the three outputs
   (`shoal.losses.objectives.Objective`).
3. `NumpyActorCritic.backward` carries those gradients through the distribution, the heads
   and the hidden layers with the chain rule written out, into each parameter's ``.grad``.
4. `NumpyActorCritic.clip` and `NumpyActorCritic.step` clip the gradients and take the
   optimizer's step (`shoal.fast.flat_step.FlatStep`).

Both passes compute with NumPy on zero-copy views of the parameters and their gradients: on
arrays of this size a NumPy call costs a fraction of a PyTorch op's dispatch (the matmuls run
at the same speed). A learner's instance (``flat_parameters=True``) moves the parameters into
one flat buffer, next to the flat gradient buffer, so that clipping is one dot product and the
optimizer step a dozen array operations. A sampler's instance acts (`NumpyActorCritic.act`)
with the same random draws as ``ActorCritic.act``.

The result equals autograd's to float32 rounding (``tests/fast/test_fast.py`` compares every
parameter's gradient for each supported model and objective). `unsupported` says which models
qualify: a CPU float32 `ActorCritic` with separate MLP trunks (`ParallelMLP`) or a shared one
(`MLP`), tanh or ReLU, and a categorical (any temperature) or diagonal-Gaussian head.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from shoal.core.types import ActOutput
from shoal.fast.flat_step import FlatStep
from shoal.fast.ops import ACTIVATIONS, gaussian_log_prob, log_softmax
from shoal.losses.objectives import PolicyOutputs
from shoal.nn.actor_critic import ActorCritic
from shoal.nn.distributions import LOG_SQRT_2PI
from shoal.nn.heads import CategoricalHead, GaussianHead
from shoal.nn.mlp import MLP, ParallelMLP
from shoal.optim import optimizer_step


class _Views(NamedTuple):
    """NumPy views of an actor-critic's parameters (or of their gradients), laid out for the
    arithmetic: each hidden layer is ``x @ weight + bias`` (``weight`` ``[in, out]``, or
    ``[2, in, out]`` for separate trunks); ``head`` is the policy head's linear layer
    (``[out, in]`` weight, bias), ``value`` the value head's (``[in]`` weight, ``[1]`` bias)."""

    layers: list[tuple[np.ndarray, np.ndarray]]
    head: tuple[np.ndarray, np.ndarray]
    value: tuple[np.ndarray, np.ndarray]
    log_std: np.ndarray | None

    @classmethod
    def of(cls, model: ActorCritic, array_of: Callable[[Tensor], np.ndarray]) -> _Views:
        """``array_of(parameter)``: the array to view (the parameter's data or its gradient)."""
        body = model.body
        if isinstance(body, ParallelMLP):
            pairs = zip(body.weights, body.biases, strict=True)
            layers = [(array_of(weight), array_of(bias)) for weight, bias in pairs]
        else:  # nn.Linear stores [out, in]: the transposed views are [in, out]
            assert isinstance(body, MLP)
            layers = [(array_of(lin.weight).T, array_of(lin.bias)) for lin in body.linears]
        head = model.policy_head
        if isinstance(head, GaussianHead):
            linear = head.mean
        else:
            assert isinstance(head, CategoricalHead)
            linear = head.logits
        value = model.value_head.value
        return cls(
            layers,
            (array_of(linear.weight), array_of(linear.bias)),
            (array_of(value.weight)[0], array_of(value.bias)),
            array_of(head.log_std) if isinstance(head, GaussianHead) else None,
        )


def unsupported(model: torch.nn.Module) -> str | None:
    """Why ``model`` has no NumPy path, or None when it has one."""
    if type(model) is not ActorCritic:
        return f"{type(model).__name__} is not a feed-forward MLP ActorCritic"
    if model.split is not None:
        return "the critic reads a part of the observation the actor does not (env.global_state)"
    if any(p.device.type != "cpu" or p.dtype != torch.float32 for p in model.parameters()):
        return "its parameters are not float32 on the CPU"
    composite = getattr(model.encoding, "composite", None)
    if composite is not None and not composite.has_numpy_path:
        return (
            "its observation encoding has weights (a Dict/Tuple observation part that is "
            "embedded, has its own MLP or is an image)"
        )
    body = model.body
    if type(body) not in (MLP, ParallelMLP):
        return "its encoder is not an MLP (model.encoder mlp)"
    if body.activation_name not in ACTIVATIONS:
        return f"model.activation {body.activation_name!r} is not one of {sorted(ACTIVATIONS)}"
    if type(body) is ParallelMLP and body.members != 2:
        return "its trunk is not one shared or two separate MLPs"
    if type(model.policy_head) not in (CategoricalHead, GaussianHead):
        return "its policy head is not categorical or diagonal Gaussian"
    return None


class NumpyActorCritic:
    """Forward pass and hand-derived backward pass of ``model`` in NumPy (module docstring)."""

    def __init__(self, model: torch.nn.Module, flat_parameters: bool = False):
        """``flat_parameters``: move the parameters into one flat buffer (each becomes a view of
        it), so that `step` updates them with a few NumPy operations; for a learner's model."""
        reason = unsupported(model)
        if reason is not None:
            raise ValueError(f"no NumPy path for this model: {reason}")
        assert isinstance(model, ActorCritic)
        self.model = model
        body = model.body
        assert isinstance(body, (MLP, ParallelMLP))  # what `unsupported` accepts
        self.parallel = isinstance(body, ParallelMLP)
        self.activation, self.activation_backward = ACTIVATIONS[body.activation_name]
        self.categorical = isinstance(model.policy_head, CategoricalHead)
        self.composite = getattr(model.encoding, "composite", None)
        self.parameters = list(model.parameters())
        self.flat_param: Tensor | None = None
        if flat_parameters:
            self.flat_param = torch.cat([p.detach().flatten() for p in self.parameters])
            for param, view in zip(self.parameters, self._pieces(self.flat_param), strict=True):
                param.data = view
        self._view_parameters()
        self.flat_grad: Tensor | None = None
        self.grad_views: _Views | None = None
        self.flat_step: FlatStep | None = None
        self.stepped: torch.optim.Optimizer | None = None

    def _pieces(self, flat: Tensor) -> list[Tensor]:
        """Views of ``flat`` shaped as the parameters, in order."""
        pieces, offset = [], 0
        for param in self.parameters:
            pieces.append(flat[offset : offset + param.numel()].view_as(param))
            offset += param.numel()
        return pieces

    def _view_parameters(self) -> None:
        """NumPy views of the parameters' memory (`load_state_dict` copies into it in place;
        `_check_views` notices when a parameter was given new memory instead)."""
        self.weights = _Views.of(self.model, lambda p: p.detach().numpy())
        self.viewed: list[Tensor] = list(self.parameters)
        head = self.model.policy_head
        if isinstance(head, CategoricalHead):
            self.temperature = head.temperature.numpy()
            self.viewed.append(head.temperature)
        self.pointers = [t.data_ptr() for t in self.viewed]

    def _check_views(self) -> None:
        if [t.data_ptr() for t in self.viewed] != self.pointers:
            self.flat_param = None
            self.flat_step = self.stepped = None
            self._view_parameters()

    def _attach_grads(self) -> _Views:
        """The gradient views, allocated at the first backward pass: one flat buffer (so that
        clipping is one dot product) whose pieces are the parameters' ``.grad``; backward
        writes them in place. Puts them back if something replaced a ``.grad``."""
        if self.flat_grad is None:
            self.flat_grad = torch.zeros(sum(p.numel() for p in self.parameters))
            self.grads = self._pieces(self.flat_grad)
            grad_of = {id(p): g for p, g in zip(self.parameters, self.grads, strict=True)}
            self.grad_views = _Views.of(self.model, lambda p: grad_of[id(p)].numpy())
        for param, grad in zip(self.parameters, self.grads, strict=True):
            if param.grad is not grad:
                param.grad = grad
        assert self.grad_views is not None
        return self.grad_views

    # --- forward ------------------------------------------------------------------------------

    def _forward(self, obs: Tensor | np.ndarray) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
        """Each layer's output (the input first), the values and the policy head's output
        (logits, tempered, or the Gaussian's mean)."""
        self._check_views()
        x = self._input(obs)
        hidden = [x]
        h = x
        for weight, bias in self.weights.layers:
            h = np.matmul(h, weight)
            h += bias
            hidden.append(self.activation(h))
        actor, critic = (h[0], h[1]) if self.parallel else (h, h)
        value_weight, value_bias = self.weights.value
        values = critic @ value_weight + value_bias
        weight, bias = self.weights.head
        out = actor @ weight.T
        out += bias
        if self.categorical:
            temperature = float(self.temperature)  # a NumPy view: cheaper than the tensor's
            if temperature != 1.0:
                out /= temperature
        return hidden, values, out

    def _input(self, obs: Tensor | np.ndarray) -> np.ndarray:
        """The network's input: float32 rows pass as they are (what the model's encoding
        leaves unchanged); anything else goes through the encoding."""
        if isinstance(obs, np.ndarray):
            if obs.dtype == np.float32 and obs.ndim == 2:
                return obs
            if self.composite is not None:  # Dict/Tuple observations: packed records
                return self.composite.numpy_features(obs)
            obs = torch.from_numpy(obs)
        elif self.composite is not None:
            return self.composite.numpy_features(obs.numpy())
        if obs.dtype == torch.float32 and obs.dim() == 2:
            return obs.contiguous().numpy()
        assert self.model.encoding is not None  # ActorCritic without split observations
        with torch.no_grad():
            return self.model.encoding(obs).contiguous().numpy()

    def act(self, obs: Tensor | np.ndarray, deterministic: bool = False) -> ActOutput:
        """``ActorCritic.act`` with NumPy arrays for results (a sampler writes them straight
        into its storage's arrays): the same actions, log-probabilities and values, and the
        same draws from the torch generator (the Gumbel noise of
        `shoal.nn.distributions.Categorical.sample`, the normal noise of
        `DiagGaussian.sample`), so a seeded run samples the same actions either way."""
        _, values, out = self._forward(obs)
        if self.categorical:
            log_probs = log_softmax(out)
            if deterministic:
                actions = log_probs.argmax(-1)
            else:
                gumbel = torch.empty(log_probs.shape).exponential_().numpy()
                actions = (log_probs - np.log(gumbel)).argmax(-1)
            log_prob = log_probs[np.arange(len(actions)), actions]
        else:
            log_std = self.weights.log_std
            assert log_std is not None  # a Gaussian head's
            actions = out
            if not deterministic:
                noise = torch.randn(out.shape).numpy()
                actions = out + np.exp(log_std) * noise
            z = (actions - out) * np.exp(-log_std)
            log_prob = gaussian_log_prob(z, log_std)
        return ActOutput(actions, log_prob, values)

    def value(self, obs: Tensor | np.ndarray) -> np.ndarray:
        return self._forward(obs)[1]

    def outputs(self, obs: np.ndarray, actions: np.ndarray) -> tuple[PolicyOutputs, tuple]:
        """The `PolicyOutputs` of ``actions`` for a training step, and what `backward` needs."""
        hidden, values, out = self._forward(obs)
        if self.categorical:
            log_probs = log_softmax(out)
            probs = np.exp(log_probs)
            index = (np.arange(len(actions)), actions.astype(np.int64, copy=False))
            log_prob = log_probs[index]
            entropy = -(probs * log_probs).sum(-1)
            distribution: tuple = (probs, log_probs, index, entropy, float(self.temperature))
        else:
            log_std = self.weights.log_std
            assert log_std is not None  # a Gaussian head's
            inv_std = np.exp(-log_std)
            z = (actions - out) * inv_std
            log_prob = gaussian_log_prob(z, log_std)
            entropy = np.full(z.shape[0], (log_std + 0.5 + LOG_SQRT_2PI).sum(), np.float32)
            distribution = (z, inv_std)
        return PolicyOutputs(log_prob, entropy, values), (hidden, distribution)

    # --- backward -----------------------------------------------------------------------------

    def backward(self, saved: tuple, grads: PolicyOutputs) -> None:
        """Set each parameter's ``.grad`` to the gradient of a loss whose gradients with
        respect to the `PolicyOutputs` of `outputs` are ``grads`` (float32 arrays; None
        where the loss does not depend on that output)."""
        views = self._attach_grads()
        hidden, distribution = saved
        features = hidden[-1]
        actor, critic = (features[0], features[1]) if self.parallel else (features, features)
        g_log_prob, g_entropy, g_values = grads
        samples = hidden[0].shape[0]
        if g_log_prob is None:
            g_log_prob = np.zeros(samples, np.float32)
        if g_values is None:
            g_values = np.zeros(samples, np.float32)

        if self.categorical:
            g_out = self._categorical_backward(distribution, g_log_prob, g_entropy)
        else:
            assert views.log_std is not None  # a Gaussian head's
            g_out = self._gaussian_backward(distribution, g_log_prob, g_entropy, views.log_std)
        # Heads: out = actor @ weight.T + bias; values = critic @ w + b.
        np.matmul(g_out.T, actor, out=views.head[0])
        g_out.sum(0, out=views.head[1])
        np.matmul(g_values, critic, out=views.value[0])
        views.value[1][0] = g_values.sum()
        # The gradient on the last hidden layer's output: [actor, critic] for separate trunks.
        head_weight, value_weight = self.weights.head[0], self.weights.value[0]
        if self.parallel:
            g_h = np.empty_like(features)
            np.matmul(g_out, head_weight, out=g_h[0])
            np.multiply.outer(g_values, value_weight, out=g_h[1])
        else:
            g_h = g_out @ head_weight
            g_h += np.multiply.outer(g_values, value_weight)

        # Hidden layers, last to first: h_out = act(h_in @ weight + bias).
        for index in range(len(views.layers) - 1, -1, -1):
            grad_weight, grad_bias = views.layers[index]
            g_pre = self.activation_backward(g_h, hidden[index + 1])
            h_in = hidden[index]
            # h_in^T @ g_pre per trunk; the input is 2-D, shared by both trunks.
            h_in_t = h_in.T if h_in.ndim == 2 else h_in.transpose(0, 2, 1)
            np.matmul(h_in_t, g_pre, out=grad_weight)
            g_pre.sum(-2, keepdims=self.parallel, out=grad_bias)
            if index > 0:
                g_h = np.matmul(g_pre, np.swapaxes(self.weights.layers[index][0], -1, -2))

    def _categorical_backward(
        self, distribution: tuple, g_log_prob: np.ndarray, g_entropy: np.ndarray | None
    ) -> np.ndarray:
        """Through log_softmax, the entropy and the temperature; returns the gradient on the
        head's output."""
        probs, log_probs, index, entropy, temperature = distribution
        # d log p_a / d logit_k = [k = a] - p_k;  d H / d logit_k = -p_k (log p_k + H).
        g_per_prob = g_log_prob[:, None]
        if g_entropy is not None:
            g_per_prob = g_per_prob + g_entropy[:, None] * (log_probs + entropy[:, None])
        g_logits = -probs * g_per_prob
        g_logits[index] += g_log_prob
        if temperature != 1.0:
            g_logits /= temperature
        return g_logits

    def _gaussian_backward(
        self,
        distribution: tuple,
        g_log_prob: np.ndarray,
        g_entropy: np.ndarray | None,
        grad_log_std: np.ndarray,
    ) -> np.ndarray:
        """Through the diagonal Gaussian's log-density and entropy; returns the gradient on
        the mean."""
        z, inv_std = distribution
        # log p = sum(-z^2 / 2 - log_std) - c with z = (a - mean) / std:
        # d log p / d mean = z / std;  d log p / d log_std = z^2 - 1;  d H / d log_std = 1.
        np.matmul(g_log_prob, z * z - 1.0, out=grad_log_std)
        if g_entropy is not None:
            grad_log_std += g_entropy.sum()
        return g_log_prob[:, None] * z * inv_std

    # --- clipping and the optimizer step ------------------------------------------------------

    def clip(self, max_grad_norm: float) -> float:
        """Scale the gradients of the last `backward` down to a global norm of
        ``max_grad_norm``, as ``torch.nn.utils.clip_grad_norm_`` does; returns the norm
        before."""
        assert self.flat_grad is not None, "clip() follows backward()"
        grad = self.flat_grad.numpy()
        norm = math.sqrt(float(grad @ grad))
        coef = max_grad_norm / (norm + 1e-6)
        if coef < 1.0:
            grad *= np.float32(coef)
        return norm

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """The optimizer's step: `FlatStep` when the parameters are flat and the optimizer
        qualifies, else `shoal.optim.optimizer_step`."""
        if self.stepped is not optimizer:  # decided once per optimizer
            self.flat_step, self.stepped = self._flat_step(optimizer), optimizer
        if self.flat_step is not None:
            self.flat_step.step()
        else:
            optimizer_step(optimizer)

    def _flat_step(self, optimizer: torch.optim.Optimizer) -> FlatStep | None:
        if self.flat_param is None or self.flat_grad is None:
            return None
        flat_step = FlatStep(optimizer, self.flat_param, self.flat_grad)
        if not flat_step.supported():  # one parameter group among its conditions
            return None
        params = optimizer.param_groups[0]["params"]
        if len(params) != len(self.parameters) or any(
            a is not b for a, b in zip(params, self.parameters, strict=True)
        ):
            return None
        return flat_step
