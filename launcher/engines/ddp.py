"""DistributedDataParallel: a full replica per rank, gradients all-reduced once per step."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from launcher.config.root import RootConfig
from launcher.distributed import DistContext
from launcher.engines import precision
from launcher.engines.base import TorchOptimizerEngine
from launcher.engines.optim import build_optimizer, build_scheduler
from launcher.parallel.mesh import DP
from launcher.parallel.pipeline_norm import pipeline_gradients


class DDPEngine(TorchOptimizerEngine):
    def __init__(self, cfg: RootConfig, model: nn.Module, ctx: DistContext) -> None:
        super().__init__(cfg)
        self.module = model.to(ctx.device)
        self._dp_group: dist.ProcessGroup | None = None
        if ctx.mesh is not None:
            # Tensor parallel: the DTensor parameters stay whole (checkpoints, norms); a
            # pipeline stage: its schedule runs the backward. Either way the replicas'
            # gradients are summed over the dp dimension once per step, in step().
            self.model = self.module
            self.tensor_parallel = ctx.tp > 1
            if ctx.dp_size > 1:
                self._dp_group = ctx.mesh.get_group(DP)
        elif ctx.world_size > 1:
            device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
            self.model: nn.Module = DistributedDataParallel(self.module, device_ids=device_ids)
        else:
            self.model = self.module  # one rank: nothing to synchronise
        # DDP averages gradients over ranks; the token-exact loss multiplies that back. Under
        # tp or pp the gradients are summed (grad_divisor 1).
        self.grad_divisor = 1.0 if ctx.mesh is not None else float(ctx.world_size)
        self.pipeline = pipeline_gradients(self.module, ctx)
        self.optimizer = build_optimizer(self.module, cfg.optim)
        self.scheduler = build_scheduler(self.optimizer, cfg.train.steps, cfg.optim)
        fp16 = precision.needs_loss_scaling(cfg.train.precision)
        self.scaler = torch.amp.GradScaler(ctx.device.type, enabled=fp16)

    def accumulation_context(self, sync: bool) -> AbstractContextManager[Any]:
        if sync or not isinstance(self.model, DistributedDataParallel):
            return nullcontext()
        return self.model.no_sync()

    def step(self) -> torch.Tensor:
        if self._dp_group is not None:
            sum_over(self.module, self._dp_group)
        return super().step()


@torch.no_grad()
def sum_over(module: nn.Module, group: dist.ProcessGroup) -> None:
    """Sum every gradient (a DTensor's local shard) over the data-parallel group: one
    all-reduce of one flat buffer per dtype."""
    grads: dict[torch.dtype, list[torch.Tensor]] = {}
    for p in module.parameters():
        if p.grad is not None:
            local = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
            grads.setdefault(local.dtype, []).append(local)
    for same in grads.values():
        flat = torch.cat([g.reshape(-1) for g in same])
        dist.all_reduce(flat, group=group)
        offset = 0
        for g in same:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()
