"""Process-group set-up for one rank: NCCL on CUDA devices, gloo otherwise."""

from __future__ import annotations

import gc
import os
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from launcher.errors import ConfigError, EnvironmentProblem


@dataclass(frozen=True)
class DistContext:
    """One rank's place in the job. The ranks form a (pp, dp, tp) mesh, tp innermost and pp
    outermost: rank = (pp_rank x dp + dp_rank) x tp + tp_rank, so a tensor-parallel group is
    consecutive ranks (one node) and a pipeline's stages may sit on different nodes."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    tp: int = 1
    """Ranks of one tensor-parallel group (parallel.tp)."""
    mesh: Any = None
    """The job's DeviceMesh with named dimensions (launcher/parallel/mesh.py), built once in the
    worker when tp > 1 or pp > 1; None otherwise (the engines' own data-parallel groups)."""
    pp: int = 1
    """Pipeline stages' ranks (parallel.pp)."""

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def dp_size(self) -> int:
        """Data-parallel ranks: distinct micro-batch streams."""
        return self.world_size // (self.tp * self.pp)

    @property
    def dp_rank(self) -> int:
        """Which micro-batch stream this rank trains (tp peers and pp stages share one)."""
        return (self.rank // self.tp) % self.dp_size

    @property
    def pp_rank(self) -> int:
        """Which pipeline rank this is (0 holds the first stage)."""
        return self.rank // (self.world_size // self.pp)

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp

    @property
    def counts_tokens(self) -> bool:
        """Whether this rank's tokens enter the step's counts and loss sums: one rank of each
        tensor-parallel group (its peers hold the same micro-batches), on the pipeline's last
        rank (the one that computes the loss)."""
        return self.tp_rank == 0 and self.pp_rank == self.pp - 1


def pick_device(requested: str, local_rank: int) -> torch.device:
    if requested == "cpu" or (requested == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise EnvironmentProblem(
            "train.device: cuda was asked for but no CUDA device is visible. Fix: set "
            "train.device=cpu or auto."
        )
    if local_rank >= torch.cuda.device_count():
        raise EnvironmentProblem(
            f"parallel.dp: local rank {local_rank} has no GPU ({torch.cuda.device_count()} "
            "visible). Fix: lower parallel.dp."
        )
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def init_distributed(requested_device: str, timeout_s: float = 600.0) -> DistContext:
    """Join the job's process group (torchrun's env://), or make a one-rank group in-process."""
    set_aside_what_is_alive()
    launched = _is_torchrun_rank()
    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = pick_device(requested_device, local_rank)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if not dist.is_initialized():
        timeout = timedelta(seconds=timeout_s)
        if launched:
            dist.init_process_group(
                backend, timeout=timeout, device_id=device if device.type == "cuda" else None
            )
        else:
            # In-process single rank: a HashStore needs no port, and every engine finds a group.
            dist.init_process_group(
                backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout
            )
    return DistContext(rank, world, local_rank, device)


def set_aside_what_is_alive() -> None:
    """A rank starts with torch's, dynamo's and the launcher's modules loaded (about a million
    objects) and keeps them to its end: set aside from the cyclic garbage collector, its later
    full collections (the CPU peak meter's, the teardown's, Python's own) walk only what the run
    made, 0.2-0.4 CPU-seconds less each. Collected first, so nothing set aside is garbage (a rank
    forked by the launcher set its inherited objects aside already: then this pass is short);
    teardown_distributed hands them back where the process may train again."""
    gc.collect()
    gc.freeze()


def check_world_size(ctx: DistContext, dp: int, nodes: int, tp: int = 1, pp: int = 1) -> None:
    """The runtime layer of validation: the job must have the ranks the config's batch split
    assumes.

    (The sampler slices each global batch into dp parts; with fewer ranks, parts would go
    untrained.)
    """
    if ctx.world_size != dp * tp * pp:
        layout = f"dp={dp}" + "".join(f" x {k}={v}" for k, v in (("tp", tp), ("pp", pp)) if v > 1)
        extra = [k for k, v in (("parallel.tp", tp), ("parallel.pp", pp)) if v > 1]
        raise ConfigError(
            ["parallel.dp", "parallel.nodes", *extra],
            f"this job has {ctx.world_size} rank(s), but the config asks for {layout} on {nodes} "
            "node(s).",
            "start it with `launch train` (which sizes torchrun and sbatch from the config), or "
            "change parallel.dp and parallel.nodes to match the job.",
        )


def teardown_distributed() -> None:
    try:
        _destroy_process_group()
    finally:
        if not _is_torchrun_rank():
            # A process that may train again (an in-process sweep's next point, a notebook):
            # what was set aside goes back to the collector, this run's config among it, or
            # every point would leave its own behind for good. A rank's process ends here.
            gc.unfreeze()


def _is_torchrun_rank() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def _destroy_process_group() -> None:
    if not dist.is_initialized():
        return
    # Free engines and models first: a DDP reducer left holding the last reference to a gloo
    # group destroys it later from a destructor, which can deadlock or abort the process.
    gc.collect()
    # DeepSpeed caches groups cloned from this world; destroying through deepspeed.comm drops
    # them too, so a later run in this process (an in-process sweep point) meets no dead group.
    ds_comm = sys.modules.get("deepspeed.comm")
    if ds_comm is not None and ds_comm.is_initialized():
        ds_comm.destroy_process_group()
    else:
        dist.destroy_process_group()
