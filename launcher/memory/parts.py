"""The per-rank memory plan: what each part of a training step holds at its peak, in bytes.

Model state follows the engine, and each engine plans its own (EngineSpec.memory_parts in
launcher/engines/<name>_spec.py): DDP and ZeRO-0 hold everything whole; ZeRO-1 shards the
optimizer state over dp, ZeRO-2 the gradients too, ZeRO-3 and FSDP2 the parameters as well. On
top of that: the copies a precision or an engine keeps (DeepSpeed's fp32 master partition), the
communication buffers (DDP's gradient buckets, FSDP2's gathered units, DeepSpeed's buckets from
the generated ds_config.json), and, engine-neutral, the activations of one micro-batch under the
recompute policy, peak of backward included (launcher/memory/probe.py measures them).
The planned peak is the sum: the activation peak comes while the whole model state is held.
With engine.offload the engine keeps some of its state in host memory (EngineSpec.host_parts): the
plan's parts and peak are the device's, host_parts and host_bytes the host's, per rank.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from launcher.config.root import RootConfig
from launcher.engines import engine_spec
from launcher.memory.probe import ActivationLine
from launcher.models.shape import STATE_PARTS, ModelShape
from launcher.parallel.shape import activation_divisor

PARTS = (*STATE_PARTS, "activations")
"""The parts of the plan, in the order they are shown."""


def state_parts(cfg: RootConfig, shape: ModelShape) -> dict[str, int]:
    """Every part but the activations on the device, per rank: the engine's
    EngineSpec.memory_parts less what it offloads (host_parts)."""
    spec = engine_spec(cfg.engine.name)
    host = spec.host_parts(cfg, shape)
    return {name: n - host.get(name, 0) for name, n in spec.memory_parts(cfg, shape).items()}


def host_parts(cfg: RootConfig, shape: ModelShape) -> dict[str, int]:
    """What engine.offload keeps in host memory, per rank (EngineSpec.host_parts)."""
    return engine_spec(cfg.engine.name).host_parts(cfg, shape)


@dataclass(frozen=True)
class MemoryPlan:
    """The per-rank plan of one configuration: its parts and their sum, the planned peak."""

    parts: dict[str, int]
    micro_size: int
    ac: str
    activation_bytes: int
    """Saved for backward at the end of one micro-batch's forward."""
    method: str
    """How the activations were found (launcher/memory/probe.py)."""
    host_parts: dict[str, int] = field(default_factory=dict)
    """What engine.offload keeps in host memory, per rank (not in `parts` nor the peak)."""
    pipeline: dict[str, Any] | None = None
    """parallel.pp > 1: every stage's saved bytes of one micro-batch and every pipeline rank's
    plan (launcher/memory/stages.py); this plan is the busiest rank's. plan.json's `pipeline`."""

    @property
    def peak(self) -> int:
        return sum(self.parts.values())

    @property
    def largest(self) -> str:
        return max(self.parts, key=lambda name: self.parts[name])

    def to_json(self) -> dict[str, Any]:
        return {
            "parts": dict(self.parts),
            "planned_peak_bytes": self.peak,
            "micro_size": self.micro_size,
            "ac": self.ac,
            "activation_bytes": self.activation_bytes,
            "activations_method": self.method,
            "host_parts": dict(self.host_parts),
            "host_bytes": sum(self.host_parts.values()),
        }


def at_micro_size(cfg: RootConfig, micro_size: int) -> RootConfig:
    """`cfg` with micro-batches of `micro_size` at the same global batch (batch.grad_accum
    follows): an engine's parts may depend on the accumulation (FSDP2's unsharded gradients)."""
    split = cfg.split()
    if not cfg.batch.auto and split.micro_size == micro_size:
        return cfg
    batch = dataclasses.replace(
        cfg.batch, global_size=split.global_size, micro_size=micro_size, grad_accum=None
    )
    return dataclasses.replace(cfg, batch=batch)


def plan_memory(
    cfg: RootConfig,
    shape: ModelShape,
    activations: ActivationLine,
    micro_size: int,
) -> MemoryPlan:
    cfg = at_micro_size(cfg, micro_size)
    shards = activation_divisor(cfg)  # tensor and sequence parallel: a rank's share
    parts = {**state_parts(cfg, shape), "activations": activations.peak(micro_size) // shards}
    host = host_parts(cfg, shape)
    return MemoryPlan(
        parts={name: int(parts[name]) for name in PARTS},
        micro_size=micro_size,
        ac=cfg.ac.policy.value,
        activation_bytes=activations.saved(micro_size) // shards,
        method=activations.method,
        host_parts={name: int(n) for name, n in host.items()},
    )
