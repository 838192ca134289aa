"""The job's device mesh: named dimensions, built once in the worker.

Ranks are laid out (dp, tp), tp innermost: a tensor-parallel group is consecutive ranks, so it
stays on one node (the config refuses a layout that would not). A pipeline dimension (issue 45)
goes outermost: ("pp", "dp", "tp").
"""

from __future__ import annotations

import dataclasses
import logging

from launcher.distributed import DistContext

DP = "dp"
"""Data-parallel: distinct micro-batch streams; FSDP2 shards and gradients reduce over it."""
TP = "tp"
"""Tensor-parallel: the ranks that split every layer and share micro-batches."""
MESH_DIMS = (DP, TP)


def with_mesh(ctx: DistContext, tp: int) -> DistContext:
    """This rank's context on the (dp, tp) mesh; unchanged (no mesh, nothing imported) at tp=1.
    Collective: every rank calls it once, after the process group is up."""
    if tp == 1:
        return ctx
    from torch.distributed.device_mesh import init_device_mesh

    # DTensor's advice to flatten (dp, tp) for the norm's two reductions, once per rank and
    # step: the reductions are exact either way, and other ranks speak only on error.
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    mesh = init_device_mesh(ctx.device.type, (ctx.world_size // tp, tp), mesh_dim_names=MESH_DIMS)
    return dataclasses.replace(ctx, tp=tp, mesh=mesh)


def mesh_lines(dp: int, tp: int, sequence_parallel: bool) -> list[str]:
    """`launch plan`'s line for the mesh under tensor parallelism (none at tp=1)."""
    if tp == 1:
        return []
    sp = ", sequence parallel" if sequence_parallel else ""
    return [
        f"mesh        ({DP} {dp}, {TP} {tp}): {tp} consecutive ranks per tensor-parallel "
        f"group{sp}; the memory plan below is per rank"
    ]
