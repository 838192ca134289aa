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


@dataclass
class EngineConfig:
    """ddp: DistributedDataParallel; fsdp: FSDP2 fully_shard; deepspeed: ZeRO stages 0-3."""

    name: EngineName = EngineName.ddp
    """ddp | fsdp | deepspeed."""
    zero_stage: int = 0
    """deepspeed: ZeRO stage 0-3."""
    extra: dict[str, Any] = field(default_factory=dict)
    """deepspeed: further ds_config keys; one that contradicts a derived value is an error."""

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
