"""What `launch` knows about each engine before any rank starts: one EngineSpec per engine.

A spec is light (no deepspeed, no FSDP import): the plan, `launch plan` and the resume checks use
it. `build` imports the engine's runtime module only when a rank builds it. The registry that maps
`engine=<name>` to its spec is launcher/engines/__init__.py.

Each engine's per-rank memory (what it shards over dp, its buckets and copies) is planned in
launcher/memory/parts.py, next to the other parts of the memory plan.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar

from launcher.config.engine import EngineName
from launcher.config.root import RootConfig
from launcher.engines.precision import needs_loss_scaling
from launcher.errors import ConfigError
from launcher.rundir import DS_CONFIG_FILE

if TYPE_CHECKING:
    from torch import nn

    from launcher.distributed import DistContext
    from launcher.engines.base import Engine

DCP_FORMAT = "dcp"
"""torch.distributed.checkpoint: reshards on load (launcher/checkpoint/dcp.py)."""


class EngineSpec(ABC):
    """One engine's plan-time knowledge, and how a rank builds it."""

    name: ClassVar[EngineName]
    label: ClassVar[str]
    """How messages name the engine."""
    checkpoint_format: ClassVar[str] = DCP_FORMAT
    """Engines that share a format read each other's checkpoints."""
    reshardable: ClassVar[bool] = True
    """Whether a checkpoint loads into another number of ranks."""
    reshard_note: ClassVar[str] = ""
    """Why not, when it cannot."""

    def zero_stage(self, cfg: RootConfig) -> int | None:
        """plan.json's zero_stage: None unless the engine has ZeRO stages."""
        del cfg
        return None

    def extra_files(self, cfg: RootConfig) -> dict[str, str]:
        """Run-directory files the engine reads (name -> text), generated before anything starts;
        a bad value raises ConfigError here, before anything is written."""
        del cfg
        return {}

    def check_environment(self, cfg: RootConfig, device_type: str) -> None:
        """Refuse what the engine cannot do on the ranks' device type ("cpu" or "cuda")."""
        del cfg, device_type

    @abstractmethod
    def build(self, cfg: RootConfig, model: nn.Module, ctx: DistContext) -> Engine:
        """Wrap the model on this rank (imports the engine's runtime module)."""


class DDPSpec(EngineSpec):
    """Everything replicated; autocast keeps fp32 parameters and gradients."""

    name = EngineName.ddp
    label = "DDP"

    def build(self, cfg: RootConfig, model: nn.Module, ctx: DistContext) -> Engine:
        from launcher.engines.ddp import DDPEngine

        return DDPEngine(cfg, model, ctx)


class FSDPSpec(EngineSpec):
    """fp32 parameters, gradients and moments all sharded over dp (the mixed-precision policy
    makes bf16/fp16 copies of one unit at a time, transient)."""

    name = EngineName.fsdp
    label = "FSDP"

    def build(self, cfg: RootConfig, model: nn.Module, ctx: DistContext) -> Engine:
        from launcher.engines.fsdp import FSDPEngine

        return FSDPEngine(cfg, model, ctx)


class DeepSpeedSpec(EngineSpec):
    """A 16-bit model under bf16/fp16, plus an fp32 master copy held by the optimizer; stage 1
    shards the optimizer state, stage 2 also the gradients, stage 3 also the parameters."""

    name = EngineName.deepspeed
    label = "DeepSpeed"
    checkpoint_format = "deepspeed"
    reshardable = False
    reshard_note = "that needs its universal-checkpoint conversion"

    def zero_stage(self, cfg: RootConfig) -> int | None:
        return cfg.engine.zero_stage

    def extra_files(self, cfg: RootConfig) -> dict[str, str]:
        from launcher.engines.ds_config import ds_config_json  # pure logic, no deepspeed

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
