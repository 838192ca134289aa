"""FSDP2 (`torch.distributed.fsdp.fully_shard`): parameters, gradients and optimizer states sharded
over the data-parallel ranks, one shard unit per block plus the root (embeddings, head).

How the token-exact loss survives FSDP2: the loss each rank backpropagates is already its share
of the global token mean, so gradients must be summed over ranks, not averaged. Every unit gets
a gradient divide factor of 1 and plain SUM reductions (also the only reduction gloo offers for
reduce-scatter), and grad_divisor = 1.

Hybrid sharding (parallel.replicate=R): a 2-D mesh, R replica groups x dp/R shards; fully_shard
reduce-scatters within a group and all-reduces across groups, both summing. engine.offload=params:
CPUOffloadPolicy keeps the shards and the optimizer step on the host (GPUs only, refused earlier).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
from torch.distributed.tensor import DTensor

from launcher.config.engine import Offload
from launcher.config.model import blocks_path
from launcher.config.root import RootConfig
from launcher.config.train import Precision
from launcher.distributed import DistContext
from launcher.engines import precision as precisions
from launcher.engines.base import TorchOptimizerEngine
from launcher.engines.fsdp_units import NEEDS_BLOCKS
from launcher.engines.optim import build_optimizer, build_scheduler
from launcher.models.blocks import require_blocks
from launcher.parallel.mesh import data_parallel_mesh
from launcher.parallel.pipeline_norm import pipeline_gradients
from launcher.parallel.pipeline_split import stage_parts


def mixed_precision_policy(precision: Precision) -> MixedPrecisionPolicy:
    """Compute in bf16/fp16, keep fp32 sharded parameters and reduce gradients in fp32."""
    return MixedPrecisionPolicy(
        param_dtype=precisions.reduced_dtype(precision), reduce_dtype=torch.float32
    )


def shard_units(model: nn.Module, blocks_path: str | None = None) -> list[nn.Module]:
    """The modules to wrap, innermost first: each repeated block, then the root. The blocks are
    found (launcher/models/blocks.py) or named by model.blocks; a model without them is refused
    rather than sharded as one unit (which would gather every parameter at once)."""
    roots = stage_parts(model)  # a pipeline rank: each stage is a root (its schedule syncs it)
    if roots[0] is not model:
        blocks = [b for root in roots for b in require_blocks(root, None, NEEDS_BLOCKS).blocks]
        return [*blocks, *roots]
    found = require_blocks(model, blocks_path, NEEDS_BLOCKS)
    return [*found.blocks, model]


def device_mesh(cfg: RootConfig, ctx: DistContext) -> DeviceMesh:
    """All ranks in one shard group, or (HSDP) `replicas` groups of consecutive ranks: a node's
    ranks are consecutive, so with one replica per node the shards stay on a node."""
    if ctx.mesh is not None:  # tp or pp: shard over the job mesh's dp dimension(s)
        return data_parallel_mesh(ctx.mesh)
    replicas = cfg.replicas()
    if replicas == 1:
        return init_device_mesh(ctx.device.type, (ctx.world_size,))
    shape = (replicas, ctx.world_size // replicas)
    return init_device_mesh(ctx.device.type, shape, mesh_dim_names=("replicate", "shard"))


def offload_policy(offload: Offload) -> OffloadPolicy:
    return CPUOffloadPolicy() if offload == Offload.params else OffloadPolicy()


class FSDPEngine(TorchOptimizerEngine):
    def __init__(self, cfg: RootConfig, model: nn.Module, ctx: DistContext) -> None:
        super().__init__(cfg)
        mesh = device_mesh(cfg, ctx)
        policy = mixed_precision_policy(cfg.train.precision)
        offload = offload_policy(cfg.engine.offload)
        model = model.to(ctx.device)
        self.units: list[FSDPModule] = []
        for unit in shard_units(model, blocks_path(cfg.model)):
            sharded = fully_shard(unit, mesh=mesh, mp_policy=policy, offload_policy=offload)
            sharded.set_gradient_divide_factor(1.0)
            sharded.set_force_sum_reduction_for_comms(True)
            self.units.append(sharded)
        self.module = self.model = model
        self.grad_divisor = 1.0
        self.tensor_parallel = ctx.tp > 1
        # A pipeline stage: its schedule drives FSDP's gradient sync (one reduce-scatter per step).
        self.pipeline = pipeline_gradients(self.module, ctx)
        if self.tensor_parallel:  # the gathered logits are a view; the loss never writes them
            warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view")
        # Built after sharding, so AdamW holds (and steps) only this rank's shards.
        self.optimizer = build_optimizer(self.module, cfg.optim)
        self.scheduler = build_scheduler(self.optimizer, cfg.train.steps, cfg.optim)
        fp16 = precisions.needs_loss_scaling(cfg.train.precision)
        # Each rank sees only its shards: the scaler agrees on inf/NaN across ranks.
        self.scaler = ShardedGradScaler(ctx.device.type, enabled=fp16)
        self._root: FSDPModule = self.units[-1]
        self._accumulates = cfg.split().grad_accum > 1

    @contextmanager
    def _sync(self, sync: bool) -> Iterator[None]:
        # Skipping the reduce-scatter of all but the last micro-batch keeps unsharded gradients
        # until the step: less communication, more memory. One micro-batch: nothing to skip.
        self._root.set_requires_gradient_sync(sync)
        yield

    def accumulation_context(self, sync: bool) -> AbstractContextManager[Any]:
        if not self._accumulates:
            return nullcontext()
        return self._sync(sync)

    def autocast(self) -> AbstractContextManager[Any]:
        return nullcontext()  # the mixed-precision policy casts parameters itself

    def full_gradient(self, param: nn.Parameter) -> torch.Tensor:
        grad = super().full_gradient(param)  # a DTensor shard: gathered from every rank
        return grad.full_tensor() if isinstance(grad, DTensor) else grad

    def global_norm(self, norm: torch.Tensor) -> torch.Tensor:
        return norm.full_tensor() if isinstance(norm, DTensor) else norm  # over all shards
