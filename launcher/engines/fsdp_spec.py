"""FSDP2 before any rank starts: fp32 parameters, gradients and moments all sharded over dp (the
mixed-precision policy makes bf16/fp16 copies of one unit at a time, transient). The runtime is
engines/fsdp.py."""

from __future__ import annotations

from typing import TYPE_CHECKING

from launcher.config.engine import EngineName
from launcher.config.root import RootConfig
from launcher.engines.fsdp_units import NEEDS_BLOCKS
from launcher.engines.precision import bytes_per_element
from launcher.engines.spec import DCPSpec, with_engine
from launcher.memory.shape import FP32, ModelShape

if TYPE_CHECKING:
    from torch import nn

    from launcher.distributed import DistContext
    from launcher.engines.base import Engine


class FSDPSpec(DCPSpec):
    name = EngineName.fsdp
    label = "FSDP"

    def needs_blocks(self, cfg: RootConfig) -> str | None:
        del cfg
        return NEEDS_BLOCKS

    def build(self, cfg: RootConfig, model: nn.Module, ctx: DistContext) -> Engine:
        from launcher.engines.fsdp import FSDPEngine

        return FSDPEngine(cfg, model, ctx)

    def memory_parts(self, cfg: RootConfig, shape: ModelShape) -> dict[str, int]:
        """fp32 shards of everything; gathered: the root unit (what is not in a block) all step,
        and about two blocks at a time (the one running, the one prefetched), plus their
        unsharded gradients before the reduce-scatter."""
        dp, p = cfg.parallel.dp, shape.parameters
        width = bytes_per_element(cfg.train.precision)
        root = p - shape.n_blocks * shape.block_parameters
        gathered = (root + 2 * shape.block_parameters) * width
        unsharded_grads = (root + shape.block_parameters) * FP32
        return {
            "parameters": p * FP32 // dp,
            "gradients": p * FP32 // dp,
            "optimizer_state": 2 * p * FP32 // dp,
            "precision_copies": 0,
            "comm_buffers": gathered + unsharded_grads,
        }

    def shards_state(self, cfg: RootConfig) -> bool:
        del cfg
        return True

    def leaner_variants(self, cfg: RootConfig) -> list[tuple[str, RootConfig]]:
        return [("engine=deepspeed engine.zero_stage=3", with_engine(cfg, EngineName.deepspeed, 3))]
