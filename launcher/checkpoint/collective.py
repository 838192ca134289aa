"""The few collectives a checkpoint's save and load agree through: a barrier, the worst status of
every rank, and whether every rank succeeded. Each is a no-op without a process group or with one
rank, so one-process runs and tests call them unchanged."""

from __future__ import annotations

import torch
import torch.distributed as dist


def barrier(group: dist.ProcessGroup | None = None) -> None:
    if dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.barrier(group=group)


def worst_status(status: int, device: torch.device, group: dist.ProcessGroup | None = None) -> int:
    """The largest of every rank's status (collective over `group`: the default one on
    `device`, or the asynchronous writer's gloo group on the CPU)."""
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return status
    flag = torch.tensor([status], dtype=torch.int32, device=device if group is None else "cpu")
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    return int(flag.item())


def every_rank(ok: bool, device: torch.device) -> bool:
    """True when `ok` holds on every rank (collective over the default group)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return ok
    flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())
