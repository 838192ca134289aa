"""The per-rank memory plan: what each part of a training step holds at its peak, in bytes.

Model state follows the engine (launcher/engines/spec.py): DDP and ZeRO-0 hold everything whole;
ZeRO-1 shards the optimizer state over dp, ZeRO-2 the gradients too, ZeRO-3 and FSDP2 the
parameters as well. On top of that: the copies a precision or an engine keeps (DeepSpeed's fp32
master partition), the communication buffers (DDP's gradient buckets, FSDP2's gathered units,
DeepSpeed's buckets from the generated ds_config.json), and the activations of one micro-batch
under the recompute policy, peak of backward included (launcher/memory/probe.py measures them).
The planned peak is the sum: the activation peak comes while the whole model state is held.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from launcher.config.root import RootConfig
from launcher.engines.precision import bytes_per_element, is_reduced
from launcher.memory.probe import ActivationLine

FP32 = 4
PARTS = (
    "parameters",
    "gradients",
    "optimizer_state",
    "precision_copies",
    "comm_buffers",
    "activations",
)
"""The parts of the plan, in the order they are shown."""

FIXES = {
    "parameters": "engine=fsdp or engine=deepspeed engine.zero_stage=3 with a larger parallel.dp",
    "gradients": "engine.zero_stage=2 or 3 (or engine=fsdp) with a larger parallel.dp",
    "optimizer_state": "engine.zero_stage=1 or more (or engine=fsdp) with a larger parallel.dp",
    "precision_copies": "a larger parallel.dp (the master copy is sharded)",
    "comm_buffers": "smaller buckets (engine.extra.zero_optimization.reduce_bucket_size)",
    "activations": "a smaller batch.micro_size or a recompute policy (ac=selective, ac=full)",
}
"""For an error's message: which keys shrink a part."""


@dataclass(frozen=True)
class ModelShape:
    """What the plan needs to know about the model (from launcher/models/probe.py)."""

    parameters: int
    block_parameters: int
    """One repeated block's parameters (FSDP2 gathers one unit at a time)."""
    n_blocks: int
    largest_parameter: int
    parameter_sizes: tuple[int, ...] = ()
    """Elements of each parameter (ZeRO-3 keeps those under its persistence threshold whole)."""


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


def ddp_parts(cfg: RootConfig, shape: ModelShape) -> dict[str, int]:
    """fp32 parameters, gradients and moments, whole; with more than one rank DDP's reducer keeps
    its own copy of every gradient in its buckets (bucket_cap_mb each)."""
    p = shape.parameters
    return {
        "parameters": p * FP32,
        "gradients": p * FP32,
        "optimizer_state": 2 * p * FP32,
        "precision_copies": 0,  # autocast's 16-bit weights live in the activations' probe
        "comm_buffers": p * FP32 if cfg.parallel.dp > 1 else 0,
    }


def fsdp_parts(cfg: RootConfig, shape: ModelShape) -> dict[str, int]:
    """fp32 shards of everything; gathered: the root unit (what is not in a block) all step, and
    about two blocks at a time (the one running, the one prefetched), plus their unsharded
    gradients before the reduce-scatter."""
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


def deepspeed_parts(
    cfg: RootConfig, shape: ModelShape, ds_config: dict[str, Any]
) -> dict[str, int]:
    """A model in the run's precision; from stage 1 an fp32 master partition held by the ZeRO
    optimizer (also in fp32: it copies); stage 1 shards the moments and, in DeepSpeed's
    implementation, the gradients as stage 2 does; stage 3 also the parameters. Buckets: the
    reduce bucket of contiguous_gradients (twice with overlap_comm in stages 1-2),
    reduce_bucket_size elements from ds_config.json (DeepSpeed's default, 5e8, is
    2 GB in fp32 whatever the model's size: set a smaller one in engine.extra for small models)."""
    dp, p, stage = cfg.parallel.dp, shape.parameters, cfg.engine.zero_stage
    width = bytes_per_element(cfg.train.precision)
    reduced = is_reduced(cfg.train.precision)
    master = p * FP32 if stage == 0 and reduced else (p * FP32 // dp if stage >= 1 else 0)
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
        limit = int(_zero(ds_config, "stage3_param_persistence_threshold", stage))
        persistent = sum(n for n in shape.parameter_sizes if n <= limit)
        sharded = p - persistent
        live = min(sharded, int(_zero(ds_config, "stage3_max_live_parameters", stage)))
        parameters = persistent * width + sharded * width // dp
        buckets += live * width + 2 * shape.block_parameters * width
    elif stage == 0 and dp > 1:
        buckets += p * width  # the flattened gradients of an all-reduce
    return {
        "parameters": parameters,
        # Stage 1 runs stage 2's code in DeepSpeed: gradients are reduced through the bucket into
        # this rank's fp32 partition, so it keeps no whole gradient either (measured, not assumed).
        "gradients": p * FP32 // dp if stage >= 1 else p * width,
        "optimizer_state": 2 * p * FP32 // (dp if stage >= 1 else 1),
        "precision_copies": master,
        "comm_buffers": buckets,
    }


def state_parts(cfg: RootConfig, shape: ModelShape, ds_config: dict[str, Any]) -> dict[str, int]:
    """Every part but the activations, per rank."""
    engine = cfg.engine.name.value
    if engine == "fsdp":
        return fsdp_parts(cfg, shape)
    if engine == "deepspeed":
        return deepspeed_parts(cfg, shape, ds_config)
    return ddp_parts(cfg, shape)


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
        }


def plan_memory(
    cfg: RootConfig,
    shape: ModelShape,
    ds_config: dict[str, Any],
    activations: ActivationLine,
    micro_size: int,
) -> MemoryPlan:
    parts = {**state_parts(cfg, shape, ds_config), "activations": activations.peak(micro_size)}
    return MemoryPlan(
        parts={name: int(parts[name]) for name in PARTS},
        micro_size=micro_size,
        ac=cfg.ac.policy.value,
        activation_bytes=activations.saved(micro_size),
        method=activations.method,
    )
