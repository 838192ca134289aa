"""Per-rank bytes of parameters, gradients and optimizer state under each engine (for the plan).

The accounting of the ZeRO paper (Rajbhandari et al. 2020), with AdamW's two fp32 moments:
- ddp: everything replicated; autocast keeps fp32 parameters and gradients.
- fsdp: fp32 parameters, gradients and moments all sharded over dp (the mixed-precision policy
  makes bf16/fp16 copies of one unit at a time, transient).
- deepspeed: a 16-bit model under bf16/fp16, plus an fp32 master copy held by the optimizer;
  stage 1 shards the optimizer state, stage 2 also the gradients, stage 3 also the parameters.
Activations, buffers and communication buckets are not included.
"""

from __future__ import annotations

from launcher.config.engine import EngineName
from launcher.config.root import RootConfig
from launcher.config.train import Precision

FP32 = 4
ADAM_MOMENTS = 2 * FP32


def state_bytes_per_rank(cfg: RootConfig, params: int) -> dict[str, int]:
    """{"parameters", "gradients", "optimizer"}: bytes on one rank."""
    dp = cfg.parallel.dp
    name = cfg.engine.name
    if name == EngineName.ddp:
        return {
            "parameters": params * FP32,
            "gradients": params * FP32,
            "optimizer": params * ADAM_MOMENTS,
        }
    if name == EngineName.fsdp:
        return {
            "parameters": params * FP32 // dp,
            "gradients": params * FP32 // dp,
            "optimizer": params * ADAM_MOMENTS // dp,
        }
    stage = cfg.engine.zero_stage
    model_width = FP32 if cfg.train.precision == Precision.fp32 else 2
    master = 0 if cfg.train.precision == Precision.fp32 else FP32
    return {
        "parameters": params * model_width // (dp if stage >= 3 else 1),
        "gradients": params * model_width // (dp if stage >= 2 else 1),
        "optimizer": params * (ADAM_MOMENTS + master) // (dp if stage >= 1 else 1),
    }
