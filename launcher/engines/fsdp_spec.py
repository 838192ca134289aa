"""FSDP2 before any rank starts: fp32 parameters, gradients and moments all sharded over dp (the
mixed-precision policy makes bf16/fp16 copies of one unit at a time, transient), or over
dp / parallel.replicate under hybrid sharding; engine.offload=params keeps the shards in host
memory (CPUOffloadPolicy, GPUs only). The runtime is engines/fsdp.py."""

from __future__ import annotations

from typing import TYPE_CHECKING

from launcher.config.engine import EngineName, Offload
from launcher.config.root import RootConfig
from launcher.engines.fsdp_units import NEEDS_BLOCKS
from launcher.engines.precision import bytes_per_element
from launcher.engines.spec import DCPSpec, offloaded, trains_on_gpu, with_engine, with_offload
from launcher.errors import ConfigError
from launcher.models.shape import FP32, ModelShape

if TYPE_CHECKING:
    from torch import nn

    from launcher.distributed import DistContext
    from launcher.engines.base import Engine


class FSDPSpec(DCPSpec):
    name = EngineName.fsdp
    label = "FSDP"

    def short_name(self, cfg: RootConfig) -> str:
        replicas = cfg.replicas()
        return f"hsdp{replicas}x{cfg.parallel.dp // replicas}" if replicas > 1 else "fsdp"

    def describe(self, cfg: RootConfig) -> list[str]:
        replicas, dp = cfg.replicas(), cfg.parallel.dp
        if replicas == 1:
            return super().describe(cfg)
        why = (
            "parallel.replicate"
            if cfg.parallel.replicate is not None
            else f"the default on {cfg.parallel.nodes} nodes: one replica per node, so the "
            "all-gathers stay on a node's own links"
        )
        line = (
            f"hybrid sharding (HSDP): state sharded over {dp // replicas} ranks, replicated over "
            f"{replicas} groups ({why})"
        )
        return [line, *super().describe(cfg)]

    def check_environment(self, cfg: RootConfig, device_type: str) -> None:
        if cfg.engine.offload == Offload.params and device_type != "cuda":
            raise ConfigError(
                ["engine.offload", "train.device"],
                "FSDP2's CPU offload (CPUOffloadPolicy) moves state from a GPU to the host, and "
                "these ranks train on the CPU already.",
                "drop engine.offload (engine.offload=none) here, or run on GPUs.",
            )

    def needs_blocks(self, cfg: RootConfig) -> str | None:
        del cfg
        return NEEDS_BLOCKS

    def build(self, cfg: RootConfig, model: nn.Module, ctx: DistContext) -> Engine:
        from launcher.engines.fsdp import FSDPEngine

        return FSDPEngine(cfg, model, ctx)

    def memory_parts(self, cfg: RootConfig, shape: ModelShape) -> dict[str, int]:
        """fp32 shards of everything over the shard group (dp / replicas); gathered: the root unit
        (what is not in a block) all step, and about two blocks at a time (the one running, the
        one prefetched), plus their unsharded gradients before the reduce-scatter.

        With batch.grad_accum > 1 the micro-batches before the last skip the reduce-scatter
        (engines/fsdp.py): every unit keeps its whole unsharded gradient, in fp32 (FSDP2
        accumulates in the reduce dtype), into the last micro-batch's backward, where each unit's
        is reduced and freed as its shard is made. So the activation peak holds the whole fp32
        gradient, not a shard (counting the shard planned dp=2 ac=full 9-17% low); with
        engine.offload=params the shards live on the host besides."""
        dp, p = cfg.parallel.dp // cfg.replicas(), shape.parameters
        width = bytes_per_element(cfg.train.precision)
        root = p - shape.n_blocks * shape.block_parameters
        gathered = (root + 2 * shape.block_parameters) * width
        t = shape.trained  # gradients and moments: none for an adapter run's frozen base
        root_trained = t - shape.n_blocks * shape.block_trained
        unsharded_grads = (root_trained + shape.block_trained) * FP32
        sharded = t * FP32 // dp
        accumulated = t * FP32 if cfg.split().grad_accum > 1 else 0
        offload = cfg.engine.offload == Offload.params
        return {
            "parameters": p * FP32 // dp,
            "gradients": sharded + accumulated if offload else accumulated or sharded,
            "optimizer_state": 2 * t * FP32 // dp,
            "precision_copies": 0,
            "comm_buffers": gathered + unsharded_grads,
        }

    def host_parts(self, cfg: RootConfig, shape: ModelShape) -> dict[str, int]:
        """engine.offload=params: the shards (parameters, gradients, moments) live on the host;
        the device gathers units and reduces gradients as without offload."""
        if cfg.engine.offload != Offload.params:
            return {}
        parts = self.memory_parts(cfg, shape)
        host = offloaded(parts, ("parameters", "gradients", "optimizer_state"))
        # The shards only: accumulated unsharded gradients stay on the device.
        host["gradients"] = shape.trained * FP32 // (cfg.parallel.dp // cfg.replicas())
        return host

    def offload_variants(self, cfg: RootConfig) -> list[tuple[str, RootConfig]]:
        if cfg.engine.offload != Offload.none or not trains_on_gpu(cfg):
            return []
        return [("engine.offload=params", with_offload(cfg, Offload.params))]

    def shards_state(self, cfg: RootConfig) -> bool:
        del cfg
        return True

    def leaner_variants(self, cfg: RootConfig) -> list[tuple[str, RootConfig]]:
        return [("engine=deepspeed engine.zero_stage=3", with_engine(cfg, EngineName.deepspeed, 3))]
