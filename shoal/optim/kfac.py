"""K-FAC: natural-gradient steps with a Kronecker-factored Fisher (Martens and Grosse 2015,
"Optimizing neural networks with Kronecker-factored approximate curvature", arXiv:1503.05671;
convolutions as in Grosse and Martens 2016, "A Kronecker-factored approximate Fisher matrix
for convolution layers", arXiv:1602.01407), with ACKTR's trust region on the step (Wu,
Mansimov, Liao, Grosse and Ba 2017, "Scalable trust-region method for deep reinforcement
learning using Kronecker-factored approximation", arXiv:1708.05144).

For a linear layer ``s = W a`` (the bias folded into ``W`` by a constant 1 appended to ``a``),
the Fisher block of ``vec(W)`` is ``E[a a^T (x) g g^T]``, approximated by ``A (x) G`` with
``A = E[a a^T]`` and ``G = E[g g^T]``, ``g = d log p / d s`` the gradient of the model's own
log-likelihood at a sampled output (the true Fisher, not the empirical one). A convolution
treats every output location as a linear layer on its input patch; with the locations assumed
independent, ``F ~ (L A) (x) G`` for ``L`` locations, ``A`` and ``G`` averaged over locations.
Both factors are running averages (``stat_decay``); their eigendecompositions
``A = Q_A diag(d_A) Q_A^T``, ``G = Q_G diag(d_G) Q_G^T`` give the damped inverse exactly:
``(A (x) G + damping I)^-1 vec(dW) = vec(Q_G [(Q_G^T dW Q_A) / (d_G d_A^T + damping)] Q_A^T)``.

The step is ACKTR's: the preconditioned direction ``Delta`` is scaled by ``scale <= 1`` so that
the step's Fisher norm ``(lr scale)^2 Delta^T F Delta = (lr scale)^2 Delta^T grad`` (twice its
second-order KL) stays under ``kl_clip``, then applied with momentum. Parameters outside the
covered layers (a Gaussian's log-std) take the plain gradient in the same step. Recurrent
layers are not covered by these factors: a model with one is refused (as in every K-FAC
library).

The layers covered: ``nn.Linear`` and ``nn.Conv2d`` modules (read through forward hooks) and
the layers of shoal's `MLP` and `ParallelMLP` (read through their ``tap``; a `ParallelMLP`
layer is ``members`` linear layers, each with its own factors). A covered layer whose
activations were never seen (called around its module, e.g. by ``F.linear``) is an error,
not a silent plain-gradient step.

Use: run the forward pass inside `KFAC.record`, call `KFAC.accumulate` with the sampled
log-likelihood (the Fisher loss) of that forward pass, then backpropagate the training loss
and call `step`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import Tensor, nn
from torch.nn import functional

from shoal.core.errors import ConfigError
from shoal.nn.mlp import MLP, ParallelMLP

RECURRENT = (nn.RNNBase, nn.LSTMCell, nn.GRUCell, nn.RNNCell)


@dataclass(eq=False)
class Layer:
    """One Kronecker-factored layer: ``members`` linear maps (1 but for a `ParallelMLP`
    layer) of ``[out, in (+1)]`` matrices, the bias as the last column."""

    name: str
    weight: Tensor
    """``[out, in]`` (linear), ``[out, C, kh, kw]`` (convolution) or ``[M, in, out]``
    (`ParallelMLP`)."""
    bias: Tensor | None
    conv: nn.Conv2d | None = None
    parallel: bool = False

    def rows(self, inputs: Tensor, grad: Tensor) -> tuple[Tensor, Tensor, int]:
        """``(a [M, R, in (+1)], g [M, R, out], samples)``: one row per sample (and output
        location of a convolution) of the layer's inputs and of the gradient at its output."""
        if self.conv is not None:
            conv = self.conv
            padding = conv.padding
            assert not isinstance(padding, str)  # refused in covered_layers
            patches = functional.unfold(
                inputs, conv.kernel_size, conv.dilation, padding, conv.stride
            )  # [B, C kh kw, L]
            a = patches.transpose(1, 2).reshape(-1, patches.shape[1])
            g = grad.flatten(2).transpose(1, 2).reshape(-1, grad.shape[1])
            a, g, samples = a.unsqueeze(0), g.unsqueeze(0), inputs.shape[0]
        elif self.parallel:
            a, g, samples = inputs, grad, inputs.shape[1]
        else:
            a = inputs.reshape(1, -1, inputs.shape[-1])
            g = grad.reshape(1, -1, grad.shape[-1])
            samples = a.shape[1]
        if self.bias is not None:
            a = torch.cat([a, a.new_ones(*a.shape[:2], 1)], dim=2)
        return a, g, samples

    def matrix(self, weight: Tensor, bias: Tensor | None) -> Tensor:
        """``weight`` and ``bias`` (the parameters, or their gradients) as ``[M, out, in (+1)]``."""
        if self.parallel:
            matrix = weight.transpose(1, 2)
            column = None if bias is None else bias.transpose(1, 2)
        else:
            matrix = weight.reshape(1, weight.shape[0], -1)
            column = None if bias is None else bias.reshape(1, -1, 1)
        return matrix if column is None else torch.cat([matrix, column], dim=2)

    def unpack(self, matrix: Tensor) -> tuple[Tensor, Tensor | None]:
        """The inverse of `matrix`: tensors shaped like the weight and the bias."""
        columns = matrix.shape[2] - (self.bias is not None)
        weight, column = matrix[:, :, :columns], matrix[:, :, columns:]
        if self.parallel:
            bias = None if self.bias is None else column.transpose(1, 2)
            return weight.transpose(1, 2), bias
        bias = None if self.bias is None else column.reshape(self.bias.shape)
        return weight.reshape(self.weight.shape), bias


def covered_layers(model: nn.Module) -> list[Layer]:
    """The layers K-FAC preconditions; a recurrent layer anywhere raises `ConfigError`."""
    layers: list[Layer] = []
    inside_mlp: set[nn.Module] = set()
    for name, module in model.named_modules():
        if isinstance(module, RECURRENT):
            raise ConfigError(
                f"K-FAC has no Kronecker factors for the recurrent layer {name!r} "
                f"({type(module).__name__}); use a feed-forward model (unset model.lstm_hidden)"
            )
        if isinstance(module, MLP):
            inside_mlp.update(module.layers)
            for i, linear in enumerate(module.linears):
                layers.append(Layer(f"{name}.layers.{i}", linear.weight, linear.bias))
        elif isinstance(module, ParallelMLP):
            for i, (weight, bias) in enumerate(zip(module.weights, module.biases, strict=True)):
                layers.append(Layer(f"{name}.{i}", weight, bias, parallel=True))
        elif isinstance(module, nn.Linear) and module not in inside_mlp:
            layers.append(Layer(name, module.weight, module.bias))
        elif isinstance(module, nn.Conv2d):
            if module.groups != 1:
                raise ConfigError(f"K-FAC does not cover the grouped convolution {name!r}")
            if isinstance(module.padding, str):
                raise ConfigError(
                    f"K-FAC needs the convolution {name!r}'s padding as numbers, not "
                    f"{module.padding!r}"
                )
            layers.append(Layer(name, module.weight, module.bias, conv=module))
    return layers


def kronecker_factors(layer: Layer, inputs: Tensor, grad: Tensor) -> tuple[Tensor, Tensor]:
    """``(A, G)``, each ``[M, n, n]``, of one batch: ``inputs`` the layer's input, ``grad``
    the gradient of the batch-summed sampled log-likelihood at its output (so each row is one
    sample's ``g``). A is averaged over samples and locations; G is averaged over samples and
    summed over locations, which puts the L of ``F ~ (L A) (x) G`` into G."""
    a, g, samples = layer.rows(inputs, grad)
    return a.transpose(1, 2) @ a / a.shape[1], g.transpose(1, 2) @ g / samples


def _itself(factor: Tensor) -> Tensor:
    return factor


class KFAC(torch.optim.Optimizer):
    """K-FAC with ACKTR's KL-clipped momentum step; see the module docstring.

    Args:
        model: the network; its covered layers are preconditioned (its other parameters take
            plain gradient steps), a recurrent layer is refused.
        lr: the step size (ACKTR: 0.25), before the trust-region scaling.
        momentum: momentum of the step.
        stat_decay: running-average decay of the Kronecker factors.
        damping: Tikhonov damping added to the Kronecker product's eigenvalues.
        kl_clip: the trust region: the step's Fisher norm is at most this.
        weight_decay: L2 term added to the gradients.
        inverse_every: recompute the eigendecompositions every this many steps.
    """

    def __init__(
        self,
        model: nn.Module,
        lr: float = 0.25,
        momentum: float = 0.9,
        stat_decay: float = 0.99,
        damping: float = 1e-2,
        kl_clip: float = 1e-3,
        weight_decay: float = 0.0,
        inverse_every: int = 1,
    ):
        for name, value in (("lr", lr), ("damping", damping), ("kl_clip", kl_clip)):
            if not value > 0:
                raise ValueError(f"{name} = {value} is invalid: must be > 0")
        if not 0.0 <= momentum < 1.0 or not 0.0 <= stat_decay < 1.0:
            raise ValueError("momentum and stat_decay must be in [0, 1)")
        if inverse_every < 1:
            raise ValueError(f"inverse_every = {inverse_every} is invalid: must be >= 1")
        self.model = model
        self.layers = covered_layers(model)
        defaults = dict(
            lr=lr, momentum=momentum, stat_decay=stat_decay, damping=damping,
            kl_clip=kl_clip, weight_decay=weight_decay, inverse_every=inverse_every,
        )  # fmt: skip
        super().__init__(list(model.parameters()), defaults)
        self._records: dict[int, list[list[Tensor | None]]] = {}
        self.last_scale = 1.0
        self.reduce: Callable[[Tensor], Tensor] = _itself
        """The whole batch's factor from one over the samples seen, a part: itself, or, on a
        rank of a learner group that sees some of the batch, the weighted sum over the ranks
        (`shoal.algos.cores.group_shares.RankRows.mean`)."""

    def _record(self, index: int, inputs: Tensor, output: Tensor) -> None:
        """Keep one call's inputs; its output gradient fills the same slot in the backward."""
        slot: list[Tensor | None] = [inputs.detach(), None]
        self._records.setdefault(index, []).append(slot)
        if output.requires_grad:
            output.register_hook(lambda grad: slot.__setitem__(1, grad.detach()))

    @contextlib.contextmanager
    def record(self) -> Iterator[None]:
        """Forward passes inside this block keep their layers' inputs for `accumulate` (the
        hooks and taps live only inside it, so copies of the model carry none)."""
        self._records.clear()
        by_weight = {id(layer.weight): i for i, layer in enumerate(self.layers)}
        handles, tapped = [], []
        for module in self.model.modules():
            if isinstance(module, MLP | ParallelMLP):
                weights = (
                    [layer.weight for layer in module.layers]
                    if isinstance(module, MLP)
                    else list(module.weights)
                )
                first = by_weight[id(weights[0])]
                module.tap = lambda i, x, out, first=first: self._record(first + i, x, out)
                tapped.append(module)
            elif isinstance(module, nn.Linear | nn.Conv2d) and id(module.weight) in by_weight:
                index = by_weight[id(module.weight)]
                hook = lambda m, inputs, out, index=index: self._record(index, inputs[0], out)  # noqa: E731
                handles.append(module.register_forward_hook(hook))
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()
            for module in tapped:
                module.tap = None

    @torch.no_grad()
    def accumulate(self, fisher_loss: Tensor) -> None:
        """Update the running factors from the recorded forward pass: ``fisher_loss`` is the
        batch mean of the model's log-likelihood of outputs sampled from itself (its graph is
        kept for the training loss's backward pass)."""
        weights = [layer.weight for layer in self.layers]
        with torch.enable_grad():
            on_path = torch.autograd.grad(
                fisher_loss, weights, retain_graph=True, allow_unused=True
            )
        decay = self.defaults["stat_decay"]
        for index, (layer, grad) in enumerate(zip(self.layers, on_path, strict=True)):
            slots = [
                (inputs, out_grad)
                for inputs, out_grad in self._records.get(index, [])
                if inputs is not None and out_grad is not None
            ]
            if grad is None:
                continue  # not on the path of this loss
            if not slots:
                raise RuntimeError(
                    f"K-FAC saw no activations of layer {layer.name!r}, which the Fisher loss "
                    "depends on: it must run through its module (or an MLP's tap)"
                )
            samples = slots[0][0].shape[1 if layer.parallel else 0]
            factors = [
                # The loss is a batch mean: one sample's gradient is the batch size times its row.
                kronecker_factors(layer, inputs, out_grad * samples)
                for inputs, out_grad in slots
            ]
            factor_a = self.reduce(cast(Tensor, sum(f[0] for f in factors) / len(factors)))
            factor_g = self.reduce(cast(Tensor, sum(f[1] for f in factors) / len(factors)))
            state = self.state[layer.weight]
            if "A" not in state:
                state["A"], state["G"] = factor_a, factor_g
            else:
                state["A"].mul_(decay).add_(factor_a, alpha=1 - decay)
                state["G"].mul_(decay).add_(factor_g, alpha=1 - decay)
        self._records.clear()

    def _eigen(self, state: dict[str, Any], refresh: bool) -> None:
        if refresh or "QA" not in state:
            state["dA"], state["QA"] = torch.linalg.eigh(state["A"])
            state["dG"], state["QG"] = torch.linalg.eigh(state["G"])
            state["dA"].clamp_(min=0.0)
            state["dG"].clamp_(min=0.0)

    def precondition(self, layer: Layer, grad: Tensor, damping: float) -> Tensor:
        """``(A (x) G + damping I)^-1 vec(grad)`` for each member's ``[out, in (+1)]``
        gradient (``grad`` ``[M, out, in (+1)]``; the plain gradient while the layer has no
        statistics yet)."""
        state = self.state[layer.weight]
        if "A" not in state:
            return grad
        self._eigen(state, refresh=False)
        rotated = state["QG"].transpose(1, 2) @ grad @ state["QA"]
        rotated = rotated / (state["dG"].unsqueeze(2) * state["dA"].unsqueeze(1) + damping)
        return state["QG"] @ rotated @ state["QA"].transpose(1, 2)

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        if closure is not None:
            raise ValueError("KFAC.step takes no closure")
        group = self.param_groups[0]
        lr, damping, decay = group["lr"], group["damping"], group["weight_decay"]
        steps = group.setdefault("steps", 0)
        refresh = steps % group["inverse_every"] == 0
        directions: dict[Tensor, Tensor] = {}
        grads: dict[Tensor, Tensor] = {}
        for layer in self.layers:
            if layer.weight.grad is None:
                continue
            bias_grad = None if layer.bias is None else layer.bias.grad
            matrix = layer.matrix(layer.weight.grad, bias_grad)
            if decay:
                matrix = matrix + decay * layer.matrix(layer.weight, layer.bias)
            if "A" in self.state[layer.weight]:
                self._eigen(self.state[layer.weight], refresh)
            weight_dir, bias_dir = layer.unpack(self.precondition(layer, matrix, damping))
            weight_grad, bias_grad = layer.unpack(matrix)
            directions[layer.weight], grads[layer.weight] = weight_dir, weight_grad
            if layer.bias is not None:
                assert bias_dir is not None and bias_grad is not None  # the layer has a bias
                directions[layer.bias], grads[layer.bias] = bias_dir, bias_grad
        for p in group["params"]:
            if p.grad is not None and p not in directions:
                grads[p] = p.grad + decay * p if decay else p.grad
                directions[p] = grads[p]
        # ACKTR's trust region: (lr scale)^2 Delta^T F Delta = (lr scale)^2 Delta^T g <= kl_clip.
        quadratic = sum((directions[p] * grads[p]).sum() for p in directions)
        predicted = (lr**2 * quadratic).clamp(min=1e-12)
        scale = torch.sqrt(group["kl_clip"] / predicted).clamp(max=1.0)
        for p, direction in directions.items():
            state = self.state[p]
            buffer = state.get("momentum")
            if buffer is None:
                buffer = state["momentum"] = torch.zeros_like(p)
            buffer.mul_(group["momentum"]).add_(direction * scale)
            p.add_(buffer, alpha=-lr * (1 - group["momentum"]))
        group["steps"] = steps + 1
        self.last_scale = float(scale)
