"""The gradient norm of the whole model under tensor parallelism, and clipping by it.

torch 2.13's clip_grad_norm_ refuses parameters on different meshes (a tp-only DTensor beside a
(dp, tp) one, or beside a plain tensor), so each group of gradients with one mesh and placement
gets its norm over every dimension (DTensor's full_tensor), and the groups combine here. A plain
gradient is the same on every rank (replicated) and counts once.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn


def total_grad_norm(params: Iterable[nn.Parameter]) -> torch.Tensor:
    """The 2-norm of every gradient of the model, equal to one process's. Collective: every rank
    calls it with the same parameters in the same order."""
    from torch.distributed.tensor import DTensor

    plain: list[torch.Tensor] = []
    groups: dict[tuple[object, ...], list[torch.Tensor]] = {}
    device = None
    for p in params:
        g = p.grad
        if g is None:
            continue
        norm = torch.linalg.vector_norm(g, 2.0, dtype=torch.float32)
        if isinstance(g, DTensor):
            groups.setdefault((g.device_mesh, g.placements), []).append(norm)
            device = g.to_local().device
        else:
            plain.append(norm)
            device = g.device
    squares = [torch.linalg.vector_norm(torch.stack(plain)).square()] if plain else []
    for norms in groups.values():  # same mesh and placements: one reduction per group
        whole = torch.linalg.vector_norm(torch.stack(norms))
        squares.append(whole.full_tensor().square())
    if not squares:
        return torch.zeros((), device=device)
    return torch.stack(squares).sum().sqrt()


def clip_by_total_norm(params: list[nn.Parameter], max_norm: float) -> torch.Tensor:
    """Scale the gradients so that their total norm is at most max_norm (math.inf: measure
    only); the total norm before clipping."""
    from torch.distributed.tensor import DTensor

    total = total_grad_norm(params)
    if max_norm == float("inf"):
        return total
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for p in params:
        if p.grad is not None:
            grad = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
            grad.mul_(coef.to(grad.device, grad.dtype))
    return total
