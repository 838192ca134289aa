"""A pipeline stage's gradients after the schedule's backward: the tied embedding/head summed
across the first and the last stage, and the gradient norm of the whole model (every stage's
share reduced over the pipeline ranks), so grad_norm and clipping equal one process's."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from launcher.distributed import DistContext
from launcher.parallel.mesh import PP
from launcher.parallel.norm import total_grad_norm
from launcher.parallel.pipeline_split import TIED_LAST


def _local(grad: torch.Tensor) -> torch.Tensor:
    to_local = getattr(grad, "to_local", None)  # an FSDP2 shard (a DTensor)
    return to_local() if to_local is not None else grad


def _in_param_layout(p: nn.Parameter) -> None:
    """A tensor-parallel gradient in its parameter's layout: DTensor's backward leaves the
    vocabulary-split embedding's gradient whole (Replicate) and the head's split (Shard(0)); the
    tied pair's local tensors must hold the same rows. Local, no communication."""
    from torch.distributed.tensor import DTensor

    grad = p.grad
    if isinstance(p, DTensor) and isinstance(grad, DTensor) and grad.placements != p.placements:
        p.grad = grad.redistribute(grad.device_mesh, p.placements)


def _tied_group(ctx: DistContext) -> Any:
    """The process group of this rank's first and last pipeline ranks (same data- and
    tensor-parallel place). Collective: every rank creates every pair, in one order."""
    if ctx.pp == 2:
        return ctx.mesh.get_group(PP)
    column = ctx.world_size // ctx.pp  # ranks per pipeline rank
    pairs = [[c, (ctx.pp - 1) * column + c] for c in range(column)]
    mine, _ = dist.new_subgroups_by_enumeration(pairs)
    return mine


class PipelineGradients:
    """Built by an engine on a pipeline stage (its parameters as the optimizer holds them).

    sync: the tied weight's two copies get the sum of both ends' gradients (one process's
    gradient of the shared tensor), so their identical optimizer steps keep them equal.
    clip: the norm over the whole model, the tied weight counted once (on the first stage)."""

    def __init__(self, module: nn.Module, ctx: DistContext) -> None:
        self.pp_group = ctx.mesh.get_group(PP)
        tied_name = getattr(module, "tied_name", None)
        self.tied = [module.get_parameter(tied_name)] if tied_name else []
        self.tied_group = _tied_group(ctx)
        self.counted = [p for n, p in module.named_parameters() if n != TIED_LAST]
        self.params = list(module.parameters())

    @torch.no_grad()
    def sync(self) -> None:
        for p in self.tied:
            if p.grad is not None:
                _in_param_layout(p)
                dist.all_reduce(_local(p.grad), group=self.tied_group)

    @torch.no_grad()
    def clip(self, max_norm: float) -> torch.Tensor:
        """Scale every gradient so the whole model's norm is at most max_norm (math.inf: measure
        only); the norm before clipping. Collective over the job; after `sync`."""
        stage = total_grad_norm(self.counted)  # over this stage's data-parallel shards
        square = stage.square().to(torch.float64)
        dist.all_reduce(square, group=self.pp_group)
        total = square.sqrt().to(torch.float32)
        if max_norm == float("inf"):
            return total
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for p in self.params:
            if p.grad is not None:
                grad = _local(p.grad)
                grad.mul_(coef.to(grad.device, grad.dtype))
        return total


def pipeline_gradients(module: nn.Module, ctx: DistContext) -> PipelineGradients | None:
    """The stage's gradient handling under pp > 1; None without a pipeline."""
    return PipelineGradients(module, ctx) if ctx.pp > 1 else None
