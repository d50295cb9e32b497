"""Natural-gradient helpers for trust-region methods (TRPO, Schulman et al. 2015,
arXiv:1502.05477, Appendix C): Fisher-vector products by double backprop of a KL, conjugate
gradient to solve ``F x = g`` without forming ``F``, and flat views of a parameter list.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

Tensors = Sequence[torch.Tensor]


def flat_concat(tensors: Tensors) -> torch.Tensor:
    """Concatenate tensors (e.g. parameters or their gradients) into one ``[P]`` vector."""
    return torch.cat([t.reshape(-1) for t in tensors])


def flat_grad(
    output: torch.Tensor, params: Tensors, create_graph: bool = False, retain_graph: bool = False
) -> torch.Tensor:
    """``d output / d params`` as one ``[P]`` vector; unused parameters get zeros."""
    grads = torch.autograd.grad(
        output,
        list(params),
        create_graph=create_graph,
        retain_graph=retain_graph or create_graph,
        allow_unused=True,
    )
    return flat_concat(
        [torch.zeros_like(p) if g is None else g for g, p in zip(grads, params, strict=True)]
    )


@torch.no_grad()
def set_flat_params(params: Tensors, flat: torch.Tensor) -> None:
    """Copy the ``[P]`` vector ``flat`` into ``params`` in place (inverse of `flat_concat`)."""
    offset = 0
    for p in params:
        n = p.numel()
        p.copy_(flat[offset : offset + n].view_as(p))
        offset += n
    if offset != flat.numel():
        raise ValueError(f"flat vector has {flat.numel()} entries, parameters hold {offset}")


def fisher_vector_product(
    kl: torch.Tensor, params: Tensors, damping: float
) -> Callable[[torch.Tensor], torch.Tensor]:
    """``v -> (F + damping I) v`` for the Fisher matrix ``F`` at the current parameters.

    ``kl`` is the mean ``KL(pi_old || pi_theta)`` with ``pi_old`` detached and equal to
    ``pi_theta``: its Hessian in ``theta`` there is the Fisher information matrix, so
    ``F v = d/dtheta ((d kl/dtheta) . v)`` costs two backward passes and never forms ``F``.
    The first-order graph is built once and reused for every product. Damping keeps the
    system positive definite where the sample Fisher is singular (TRPO Appendix C.1).
    """
    grad_kl = flat_grad(kl, params, create_graph=True)

    def product(v: torch.Tensor) -> torch.Tensor:
        fv = flat_grad(grad_kl @ v.detach(), params, retain_graph=True)
        return fv + damping * v

    return product


def conjugate_gradient(
    fvp: Callable[[torch.Tensor], torch.Tensor],
    b: torch.Tensor,
    iters: int = 10,
    residual_tol: float = 1e-10,
) -> torch.Tensor:
    """Approximately solve ``A x = b`` for symmetric positive-definite ``A`` given only
    ``fvp(v) = A v`` (Hestenes & Stiefel 1952), starting from ``x = 0``.

    ``b [P]`` -> ``x [P]``. Stops after ``iters`` products or once the squared residual norm
    ``|b - A x|^2`` falls below ``residual_tol``. In exact arithmetic it is exact after ``P``
    iterations; TRPO uses about 10, enough for a good step direction.
    """
    x = torch.zeros_like(b)
    r = b.clone()
    p = b.clone()
    rr = r @ r
    for _ in range(iters):
        if rr < residual_tol:
            break
        ap = fvp(p)
        alpha = rr / (p @ ap)
        x = x + alpha * p
        r = r - alpha * ap
        rr_new = r @ r
        p = r + (rr_new / rr) * p
        rr = rr_new
    return x
