"""DDP before any rank starts: everything replicated; autocast keeps fp32 parameters and
gradients. The runtime is engines/ddp.py."""

from __future__ import annotations

from typing import TYPE_CHECKING

from launcher.config.engine import EngineName
from launcher.config.root import RootConfig
from launcher.engines.spec import DCPSpec, with_engine
from launcher.models.shape import FP32, ModelShape

if TYPE_CHECKING:
    from torch import nn

    from launcher.distributed import DistContext
    from launcher.engines.base import Engine


class DDPSpec(DCPSpec):
    name = EngineName.ddp
    label = "DDP"

    def build(self, cfg: RootConfig, model: nn.Module, ctx: DistContext) -> Engine:
        from launcher.engines.ddp import DDPEngine

        return DDPEngine(cfg, model, ctx)

    def memory_parts(self, cfg: RootConfig, shape: ModelShape) -> dict[str, int]:
        """fp32 parameters, gradients and moments, whole; with more than one rank DDP's reducer
        keeps its own copy of every gradient in its buckets (bucket_cap_mb each)."""
        p, t = shape.parameters, shape.trained  # t: all but an adapter run's frozen base
        return {
            "parameters": p * FP32,
            "gradients": t * FP32,
            "optimizer_state": 2 * t * FP32,
            "precision_copies": 0,  # autocast's 16-bit weights live in the activations' probe
            "comm_buffers": t * FP32 if cfg.parallel.dp > 1 else 0,
        }

    def leaner_variants(self, cfg: RootConfig) -> list[tuple[str, RootConfig]]:
        return [
            ("engine=fsdp", with_engine(cfg, EngineName.fsdp)),
            ("engine=deepspeed engine.zero_stage=3", with_engine(cfg, EngineName.deepspeed, 3)),
        ]
