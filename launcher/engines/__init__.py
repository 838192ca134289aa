"""Engines wrap the model and optimizer behind one small interface (see base.Engine).

Each engine module is imported only when chosen, so a DDP run never imports deepspeed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from launcher.config.engine import EngineName

if TYPE_CHECKING:
    from torch import nn

    from launcher.config.root import RootConfig
    from launcher.distributed import DistContext
    from launcher.engines.base import Engine


def build_engine(cfg: RootConfig, model: nn.Module, ctx: DistContext) -> Engine:
    name = cfg.engine.name
    if name == EngineName.ddp:
        from launcher.engines.ddp import DDPEngine

        return DDPEngine(cfg, model, ctx)
    if name == EngineName.fsdp:
        from launcher.engines.fsdp import FSDPEngine

        return FSDPEngine(cfg, model, ctx)
    from launcher.engines.deepspeed import DeepSpeedEngine

    return DeepSpeedEngine(cfg, model, ctx)
