"""The job's device mesh: named dimensions, built once in the worker.

Ranks are laid out (dp, tp), tp innermost: a tensor-parallel group is consecutive ranks, so it
stays on one node (the config refuses a layout that would not). With FSDP2's hybrid sharding
(parallel.replicate=R) the data-parallel dimension is two: ("dp_replicate", "dp_shard", "tp").
Pipeline stages (parallel.pp > 1) are the outermost dimension: ("pp", "dp", "tp"), so a stage's
data-parallel and tensor-parallel peers are consecutive ranks and the stages may cross nodes;
with tp > 1 too (3-D), each stage's blocks are split over its tp sub-mesh.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from launcher.distributed import DistContext

DP = "dp"
"""Data-parallel: distinct micro-batch streams; FSDP2 shards and gradients reduce over it."""
TP = "tp"
"""Tensor-parallel: the ranks that split every layer and share micro-batches."""
MESH_DIMS = (DP, TP)
PP = "pp"
"""Pipeline: the ranks that hold consecutive stages of one model and pass activations on."""
DP_REPLICATE, DP_SHARD = "dp_replicate", "dp_shard"
"""Hybrid sharding: the replica groups, and the ranks one group shards over."""


def with_mesh(ctx: DistContext, tp: int, replicas: int = 1, pp: int = 1) -> DistContext:
    """This rank's context on the (dp, tp) mesh (dp split into replicas x shards under hybrid
    sharding), or the (pp, dp, tp) mesh with pipeline stages; unchanged (no mesh, nothing
    imported) at tp=1 and pp=1. Collective: every rank calls it once, after the process group is
    up."""
    if tp == 1 and pp == 1:
        return ctx
    from torch.distributed.device_mesh import init_device_mesh

    # DTensor's advice to flatten (dp, tp) for the norm's two reductions, once per rank and
    # step: the reductions are exact either way, and other ranks speak only on error.
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    if pp > 1:  # tensor parallelism, if any, inside each stage: its tp sub-mesh
        dp = ctx.world_size // (tp * pp)
        mesh = init_device_mesh(ctx.device.type, (pp, dp, tp), mesh_dim_names=(PP, DP, TP))
        return dataclasses.replace(ctx, tp=tp, pp=pp, mesh=mesh)
    dp = ctx.world_size // tp
    shape: tuple[int, ...]
    names: tuple[str, ...]
    if replicas > 1:
        shape, names = (replicas, dp // replicas, tp), (DP_REPLICATE, DP_SHARD, TP)
    else:
        shape, names = (dp, tp), MESH_DIMS
    mesh = init_device_mesh(ctx.device.type, shape, mesh_dim_names=names)
    return dataclasses.replace(ctx, tp=tp, mesh=mesh)


def data_parallel_mesh(mesh: Any) -> Any:
    """The mesh's data-parallel part: ("dp",), or (replicate, shard) under hybrid sharding."""
    names = mesh.mesh_dim_names or ()
    return mesh[DP] if DP in names else mesh[DP_REPLICATE, DP_SHARD]


def mesh_lines(dp: int, tp: int, sequence_parallel: bool, pp: int = 1) -> list[str]:
    """`launch plan`'s line for the mesh under tensor parallelism, with pipeline stages the 3-D
    one (none at tp=1: the pipeline's own lines say the rest)."""
    if tp == 1:
        return []
    sp = ", sequence parallel" if sequence_parallel else ""
    groups = f"{tp} consecutive ranks per tensor-parallel group{sp}"
    if pp == 1:
        return [f"mesh        ({DP} {dp}, {TP} {tp}): {groups}; the memory plan below is per rank"]
    return [
        f"mesh        ({PP} {pp}, {DP} {dp}, {TP} {tp}): {groups}, {dp * tp} ranks per pipeline "
        "stage; the memory plan below is per rank"
    ]
