"""DeepSpeed before any rank starts: a 16-bit model under bf16/fp16, plus an fp32 master copy held
by the optimizer; stage 1 shards the optimizer state, stage 2 also the gradients, stage 3 also the
parameters. The runtime is engines/deepspeed.py (which imports deepspeed itself); the JSON config
both read is engines/ds_config.py (pure logic)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from launcher.config.engine import EngineName, Offload
from launcher.config.root import RootConfig
from launcher.engines.ds_config import build_ds_config, ds_config_json
from launcher.engines.precision import bytes_per_element, is_reduced, needs_loss_scaling
from launcher.engines.spec import (
    EngineSpec,
    offloaded,
    trains_on_gpu,
    with_engine,
    with_offload,
)
from launcher.errors import ConfigError
from launcher.models.shape import FP32, ModelShape
from launcher.rundir import DS_CONFIG_FILE

if TYPE_CHECKING:
    from pathlib import Path

    import torch
    from torch import nn

    from launcher.distributed import DistContext
    from launcher.engines.base import Engine

# DeepSpeed's own defaults for the keys the plan reads (deepspeed/runtime/zero/config.py).
DS_DEFAULTS = {
    "reduce_bucket_size": 5e8,
    "allgather_bucket_size": 5e8,
    "contiguous_gradients": True,
    "stage3_param_persistence_threshold": 1e5,
    "stage3_max_live_parameters": 1e9,
}


def _zero(ds_config: dict[str, Any], key: str, stage: int) -> Any:
    zero = ds_config.get("zero_optimization", {})
    if key == "overlap_comm":
        return zero.get(key, stage == 3)
    return zero.get(key, DS_DEFAULTS.get(key))


def _persistent(ds_config: dict[str, Any], shape: ModelShape) -> int:
    """ZeRO-3's parameters kept whole on every rank: those up to the persistence threshold."""
    limit = int(_zero(ds_config, "stage3_param_persistence_threshold", 3))
    return sum(n for n in shape.parameter_sizes if n <= limit)


class DeepSpeedSpec(EngineSpec):
    name = EngineName.deepspeed
    label = "DeepSpeed"
    checkpoint_format = "deepspeed"
    reshardable = False
    reshard_note = "that needs its universal-checkpoint conversion"

    def zero_stage(self, cfg: RootConfig) -> int | None:
        return cfg.engine.zero_stage

    def short_name(self, cfg: RootConfig) -> str:
        offload = cfg.engine.offload
        suffix = f"+offload_{offload.value}" if offload != Offload.none else ""
        return f"zero{cfg.engine.zero_stage}{suffix}"

    def extra_files(self, cfg: RootConfig) -> dict[str, str]:
        return {DS_CONFIG_FILE: ds_config_json(cfg)}

    def check_environment(self, cfg: RootConfig, device_type: str) -> None:
        if needs_loss_scaling(cfg.train.precision) and device_type != "cuda":
            raise ConfigError(
                ["train.precision", "engine"],
                "DeepSpeed has no fp16 on CPU (its CPU accelerator supports fp32 and bf16).",
                "use train.precision=bf16 or fp32 here, or run on GPUs.",
            )

    def build(self, cfg: RootConfig, model: nn.Module, ctx: DistContext) -> Engine:
        from launcher.engines.deepspeed import DeepSpeedEngine  # imports deepspeed itself

        return DeepSpeedEngine(cfg, model, ctx)

    def memory_parts(self, cfg: RootConfig, shape: ModelShape) -> dict[str, int]:
        """A model in the run's precision; from stage 1 an fp32 master partition held by the ZeRO
        optimizer (also in fp32: it copies); stage 1 shards the moments and, in DeepSpeed's
        implementation, the gradients as stage 2 does; stage 3 also the parameters. Buckets: the
        reduce bucket of contiguous_gradients (twice with overlap_comm in stages 1-2),
        reduce_bucket_size elements from ds_config.json (DeepSpeed's default, 5e8, is 2 GB in
        fp32 whatever the model's size: set a smaller one in engine.extra for small models)."""
        ds_config = build_ds_config(cfg)
        dp, p, stage = cfg.parallel.dp, shape.parameters, cfg.engine.zero_stage
        width = bytes_per_element(cfg.train.precision)
        reduced = is_reduced(cfg.train.precision)
        t = shape.trained  # gradients, moments, master copy: none for a frozen base
        master = t * FP32 if stage == 0 and reduced else (t * FP32 // dp if stage >= 1 else 0)
        buckets = 0
        if stage >= 1 and _zero(ds_config, "contiguous_gradients", stage):
            # Stages 1-2 double-buffer under overlap_comm; stage 3 keeps one flat bucket.
            copies = 2 if stage < 3 and _zero(ds_config, "overlap_comm", stage) else 1
            buckets = int(_zero(ds_config, "reduce_bucket_size", stage)) * width * copies
        parameters = p * width
        if stage == 3:
            # Parameters up to the persistence threshold stay whole on every rank; the others are
            # sharded, and gathered ones stay gathered while they will be reused soon (DeepSpeed's
            # max_reuse_distance), up to max_live_parameters: all of them, for models under 1e9.
            persistent = _persistent(ds_config, shape)
            sharded = p - persistent
            live = min(sharded, int(_zero(ds_config, "stage3_max_live_parameters", stage)))
            parameters = persistent * width + sharded * width // dp
            buckets += live * width + 2 * shape.block_parameters * width
        elif stage == 0 and dp > 1:
            buckets += t * width  # the flattened gradients of an all-reduce
        return {
            "parameters": parameters,
            # Stage 1 runs stage 2's code in DeepSpeed: gradients are reduced through the bucket
            # into this rank's fp32 partition, so it keeps no whole gradient either (measured).
            "gradients": t * FP32 // dp if stage >= 1 else t * width,
            "optimizer_state": 2 * t * FP32 // (dp if stage >= 1 else 1),
            "precision_copies": master,
            "comm_buffers": buckets,
        }

    def host_parts(self, cfg: RootConfig, shape: ModelShape) -> dict[str, int]:
        """ZeRO-Offload: the optimizer's partition (moments, fp32 master, the fp32 gradients it
        steps) in host memory; offload_param also the sharded 16-bit parameters (the persistent
        ones and the gathered ones stay on the device)."""
        offload = cfg.engine.offload
        if offload == Offload.none:
            return {}
        parts = self.memory_parts(cfg, shape)
        host = offloaded(parts, ("gradients", "optimizer_state", "precision_copies"))
        if offload == Offload.params:
            width = bytes_per_element(cfg.train.precision)
            persistent = _persistent(build_ds_config(cfg), shape)
            host["parameters"] = parts["parameters"] - persistent * width
        return host

    def offload_variants(self, cfg: RootConfig) -> list[tuple[str, RootConfig]]:
        stage, offload = cfg.engine.zero_stage, cfg.engine.offload
        if stage == 0 or not trains_on_gpu(cfg):
            return []
        more = [Offload.optimizer, Offload.params] if stage == 3 else [Offload.optimizer]
        more = more[more.index(offload) + 1 :] if offload in more else more
        return [(f"engine.offload={o.value}", with_offload(cfg, o)) for o in more]

    def casts_model(self, cfg: RootConfig) -> bool:
        return is_reduced(cfg.train.precision)

    def shards_state(self, cfg: RootConfig) -> bool:
        return cfg.engine.zero_stage >= 1

    def leaner_variants(self, cfg: RootConfig) -> list[tuple[str, RootConfig]]:
        return [
            (f"engine.zero_stage={stage}", with_engine(cfg, EngineName.deepspeed, stage))
            for stage in range(cfg.engine.zero_stage + 1, 4)
        ]

    def buffer_advice(self, cfg: RootConfig) -> str | None:
        if cfg.engine.zero_stage == 0:  # no reduce bucket: the flattened gradients of all-reduce
            return None
        size = int(_zero(build_ds_config(cfg), "reduce_bucket_size", cfg.engine.zero_stage))
        return f"a smaller engine.extra.zero_optimization.reduce_bucket_size (now {size:,})"

    def read_weights(
        self, directory: Path, model: nn.Module, cfg: RootConfig
    ) -> dict[str, torch.Tensor]:
        from launcher.engines.deepspeed import read_weights  # imports deepspeed itself

        del model
        return read_weights(directory, cfg.engine.zero_stage)
