"""The distributed engine inside each rank."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from launcher.errors import ConfigError


class EngineName(str, Enum):
    ddp = "ddp"
    fsdp = "fsdp"
    deepspeed = "deepspeed"


class Offload(str, Enum):
    """What a sharding engine keeps in host memory instead of on the device (docs/memory.md)."""

    none = "none"
    optimizer = "optimizer"
    """The optimizer step on the CPU: its state, the fp32 master copy and the gradients it reads
    (DeepSpeed ZeRO-Offload, stages 1-3)."""
    params = "params"
    """The sharded parameters too (DeepSpeed ZeRO-3 offload_param; FSDP2's CPUOffloadPolicy,
    which moves parameters, gradients and the optimizer step together)."""


@dataclass
class EngineConfig:
    """ddp: DistributedDataParallel; fsdp: FSDP2 fully_shard; deepspeed: ZeRO stages 0-3."""

    name: EngineName = EngineName.ddp
    """ddp | fsdp | deepspeed."""
    zero_stage: int = 0
    """deepspeed: ZeRO stage 0-3."""
    extra: dict[str, Any] = field(default_factory=dict)
    """deepspeed: further ds_config keys; one that contradicts a derived value is an error."""
    offload: Offload = Offload.none
    """none | optimizer (deepspeed, zero_stage 1-3) | params (deepspeed zero_stage 3, or fsdp on
    GPUs): state kept in host memory, for a model that does not fit otherwise."""

    def __post_init__(self) -> None:
        if self.zero_stage not in (0, 1, 2, 3):
            raise ConfigError("engine.zero_stage", f"must be 0, 1, 2 or 3, got {self.zero_stage}.")
        if self.name != EngineName.deepspeed and (self.zero_stage or self.extra):
            key = "engine.zero_stage" if self.zero_stage else "engine.extra"
            raise ConfigError(
                key,
                f"only applies to engine=deepspeed (engine is {self.name.value}).",
                f"add engine=deepspeed or drop {key}.",
            )
        self._check_offload()

    def _check_offload(self) -> None:
        """Which engine and stage can offload what (the device is checked by the engine's spec,
        launcher/engines/fsdp_spec.py, at launch)."""
        offload = self.offload
        if offload == Offload.none:
            return
        if self.name == EngineName.ddp:
            raise ConfigError(
                "engine.offload",
                f"{offload.value} needs a sharding engine; DDP keeps everything on the device.",
                "add engine=fsdp engine.offload=params, or engine=deepspeed engine.zero_stage=2 "
                "(optimizer), or drop engine.offload.",
            )
        if self.name == EngineName.fsdp and offload == Offload.optimizer:
            raise ConfigError(
                "engine.offload",
                "FSDP2's CPUOffloadPolicy moves parameters, gradients and the optimizer step "
                "together: it has no optimizer-only offload.",
                "use engine.offload=params, or engine=deepspeed engine.zero_stage=2 "
                "engine.offload=optimizer.",
            )
        if self.name != EngineName.deepspeed:
            return
        if offload == Offload.optimizer and self.zero_stage == 0:
            raise ConfigError(
                ["engine.offload", "engine.zero_stage"],
                "ZeRO-Offload moves the optimizer's partition, and stage 0 has none.",
                "set engine.zero_stage=1, 2 or 3 (2 is ZeRO-Offload's usual choice).",
            )
        if offload == Offload.params and self.zero_stage != 3:
            raise ConfigError(
                ["engine.offload", "engine.zero_stage"],
                f"DeepSpeed offloads parameters only in ZeRO stage 3 (zero_stage is "
                f"{self.zero_stage}).",
                "set engine.zero_stage=3, or engine.offload=optimizer.",
            )
