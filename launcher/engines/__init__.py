"""Engines wrap the model and optimizer behind one small interface (see base.Engine).

This module is the one place that maps `engine=<name>` to its EngineSpec (engines/spec.py): the
plan, `launch`'s checks, the resume rules, the memory plan, verify and the checkpoint readers ask
the spec, never compare names. Each engine's runtime module is imported only when a rank builds
it, so a DDP run never imports deepspeed. Adding an engine: its spec (<name>_spec.py) and its
runtime module (<name>.py) here in engines/, and one line below (docs/development.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from launcher.config.engine import EngineName
from launcher.engines.ddp_spec import DDPSpec
from launcher.engines.deepspeed_spec import DeepSpeedSpec
from launcher.engines.fsdp_spec import FSDPSpec
from launcher.engines.spec import EngineSpec

if TYPE_CHECKING:
    from torch import nn

    from launcher.config.root import RootConfig
    from launcher.distributed import DistContext
    from launcher.engines.base import Engine

_SPECS: dict[EngineName, EngineSpec] = {
    spec.name: spec for spec in (DDPSpec(), FSDPSpec(), DeepSpeedSpec())
}


def engine_spec(name: EngineName) -> EngineSpec:
    """The spec of `engine=<name>`."""
    return _SPECS[name]


def engine_spec_named(name: str) -> EngineSpec | None:
    """The spec of an engine named in a file (a checkpoint's meta.json); None if unknown."""
    try:
        return _SPECS[EngineName(name)]
    except ValueError:
        return None


def build_engine(cfg: RootConfig, model: nn.Module, ctx: DistContext) -> Engine:
    return engine_spec(cfg.engine.name).build(cfg, model, ctx)


def checkpoint_formats_note() -> str:
    """Which engines read each other's checkpoints, e.g. "ddp and fsdp share a format, deepspeed
    has its own"."""
    groups: dict[str, list[str]] = {}
    for name, spec in _SPECS.items():
        groups.setdefault(spec.checkpoint_format, []).append(name.value)
    return ", ".join(
        f"{' and '.join(names)} share a format" if len(names) > 1 else f"{names[0]} has its own"
        for names in groups.values()
    )


def reshardable_engines() -> list[str]:
    """The engines whose checkpoints load into another number of ranks."""
    return [name.value for name, spec in _SPECS.items() if spec.reshardable]
