"""DistributedDataParallel: a full replica per rank, gradients all-reduced once per step."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from launcher.config.root import RootConfig
from launcher.distributed import DistContext
from launcher.engines import precision
from launcher.engines.base import TorchOptimizerEngine
from launcher.engines.optim import build_optimizer, build_scheduler


class DDPEngine(TorchOptimizerEngine):
    def __init__(self, cfg: RootConfig, model: nn.Module, ctx: DistContext) -> None:
        super().__init__(cfg)
        self.module = model.to(ctx.device)
        if ctx.world_size > 1:
            device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
            self.model: nn.Module = DistributedDataParallel(self.module, device_ids=device_ids)
        else:
            self.model = self.module  # one rank: nothing to synchronise
        # DDP averages gradients over ranks; the token-exact loss multiplies that back.
        self.grad_divisor = float(ctx.world_size)
        self.optimizer = build_optimizer(self.module, cfg.optim)
        self.scheduler = build_scheduler(self.optimizer, cfg.train.steps, cfg.optim)
        fp16 = precision.needs_loss_scaling(cfg.train.precision)
        self.scaler = torch.amp.GradScaler(ctx.device.type, enabled=fp16)

    def accumulation_context(self, sync: bool) -> AbstractContextManager[Any]:
        if sync or not isinstance(self.model, DistributedDataParallel):
            return nullcontext()
        return self.model.no_sync()
