"""What `launch` knows about each engine before any rank starts: one EngineSpec per engine.

A spec is light (no deepspeed, no FSDP import): the plan, `launch plan`, the resume checks, the
memory plan, verify's report and the checkpoint readers use it. Everything that differs by engine
is a method here, written once per engine in its own spec file (ddp_spec.py, fsdp_spec.py,
deepspeed_spec.py); the rank-side differences are methods of engines/base.py's Engine. `build`
and `read_weights` import the engine's runtime module only when they run. The registry that maps
`engine=<name>` to its spec is launcher/engines/__init__.py.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from launcher.config.engine import EngineName, Offload
from launcher.config.root import RootConfig

if TYPE_CHECKING:
    import torch
    from torch import nn

    from launcher.distributed import DistContext
    from launcher.engines.base import Engine
    from launcher.models.shape import ModelShape

DCP_FORMAT = "dcp"
"""torch.distributed.checkpoint: reshards on load (launcher/engines/dcp.py)."""


def with_engine(cfg: RootConfig, name: EngineName, stage: int = 0) -> RootConfig:
    """`cfg` under another engine (or ZeRO stage): a variant the memory plan compares."""
    engine = dataclasses.replace(cfg.engine, name=name, zero_stage=stage)
    return dataclasses.replace(cfg, engine=engine)


def with_offload(cfg: RootConfig, offload: Offload) -> RootConfig:
    """`cfg` with another engine.offload."""
    return dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine, offload=offload))


OFFLOADS = {
    Offload.optimizer: "the optimizer's state, fp32 master copy and gradients",
    Offload.params: "the sharded parameters, gradients and optimizer state",
}


def offload_line(cfg: RootConfig) -> list[str]:
    """The plan's line for engine.offload (the bytes are in the memory plan's host row)."""
    offload = cfg.engine.offload
    if offload == Offload.none:
        return []
    return [f"offload (engine.offload={offload.value}): {OFFLOADS[offload]} in host memory"]


def trains_on_gpu(cfg: RootConfig) -> bool:
    """Whether the ranks train on GPUs (offload only helps there: on the CPU, host memory is the
    device's)."""
    if cfg.train.device != "auto":
        return cfg.train.device == "cuda"
    if cfg.cluster.gpus_per_node:
        return True
    import torch

    return torch.cuda.is_available()


def offloaded(parts: dict[str, int], names: tuple[str, ...]) -> dict[str, int]:
    """The named parts, all in host memory."""
    return {name: parts[name] for name in names if parts[name]}


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

    def short_name(self, cfg: RootConfig) -> str:
        """The engine with its options in a table cell (verify's certificate, sweeps): "ddp",
        "zero3"."""
        del cfg
        return self.name.value

    def describe(self, cfg: RootConfig) -> list[str]:
        """The engine's options in words for the plan (hybrid sharding, offload); one line each."""
        return offload_line(cfg)

    def extra_files(self, cfg: RootConfig) -> dict[str, str]:
        """Run-directory files the engine reads (name -> text), generated before anything starts;
        a bad value raises ConfigError here, before anything is written."""
        del cfg
        return {}

    def check_environment(self, cfg: RootConfig, device_type: str) -> None:
        """Refuse what the engine cannot do on the ranks' device type ("cpu" or "cuda")."""
        del cfg, device_type

    def needs_blocks(self, cfg: RootConfig) -> str | None:
        """Why the engine needs the model's repeated blocks (said in the error for a model without
        them, launcher/models/blocks.py), or None when it does not."""
        del cfg
        return None

    @abstractmethod
    def build(self, cfg: RootConfig, model: nn.Module, ctx: DistContext) -> Engine:
        """Wrap the model on this rank (imports the engine's runtime module)."""

    # The memory plan (launcher/memory/): the engine's share of a rank's peak.

    @abstractmethod
    def memory_parts(self, cfg: RootConfig, shape: ModelShape) -> dict[str, int]:
        """Bytes per rank of each of models.shape.STATE_PARTS (everything but the activations)
        held at the step's peak, wherever they live: what the engine shards over parallel.dp, the
        copies it keeps, its communication buffers. `host_parts` says how much is in host
        memory."""

    def host_parts(self, cfg: RootConfig, shape: ModelShape) -> dict[str, int]:
        """Bytes per rank of each part that engine.offload keeps in host memory (the device holds
        the rest of memory_parts); empty without offload."""
        del cfg, shape
        return {}

    def offload_variants(self, cfg: RootConfig) -> list[tuple[str, RootConfig]]:
        """Configurations at the same engine that offload more, least first, each with its
        overrides: what `auto` tries when nothing fits on the device."""
        del cfg
        return []

    def casts_model(self, cfg: RootConfig) -> bool:
        """Whether the engine holds the model itself in the run's 16-bit dtype (no autocast): the
        activation probe runs the model so."""
        del cfg
        return False

    def shards_state(self, cfg: RootConfig) -> bool:
        """Whether a larger parallel.dp shrinks a rank's model state (the budget error offers
        it)."""
        del cfg
        return False

    def leaner_variants(self, cfg: RootConfig) -> list[tuple[str, RootConfig]]:
        """Configurations at the same dp that shard more of the model state, least change first,
        each with the overrides that give it: the budget error's fixes and its smallest plan."""
        del cfg
        return []

    def buffer_advice(self, cfg: RootConfig) -> str | None:
        """What shrinks the engine's communication buffers, in words, for the budget error when
        they are the plan's largest part; None when no option of the engine does."""
        del cfg
        return None

    # The weights of a checkpoint, for the readers (launcher/checkpoint/weights.py).

    @abstractmethod
    def read_weights(
        self, directory: Path, model: nn.Module, cfg: RootConfig
    ) -> dict[str, torch.Tensor]:
        """The model weights in a checkpoint's engine directory, whatever dp wrote them, read in
        this one process without a process group. `model` is the plain model the run's config
        builds (shapes and names to read into; left unchanged). Keys are its parameter and buffer
        names; a weight tied to another may be given once."""


class DCPSpec(EngineSpec):
    """An engine whose checkpoint is TorchOptimizerEngine's DCP (engines/base.py)."""

    def read_weights(
        self, directory: Path, model: nn.Module, cfg: RootConfig
    ) -> dict[str, torch.Tensor]:
        from launcher.engines.dcp import read_model_weights

        del cfg
        return read_model_weights(directory, model)
