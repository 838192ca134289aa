"""The few collectives a checkpoint's save and load agree through: a barrier, the worst status of
every rank, whether every rank succeeded, and one rank's failed write turned into every rank's.
Each is a no-op without a process group or with one rank, so one-process runs and tests call them
unchanged.

Nothing here imports torch.distributed.checkpoint (DCP): a run that never saves or loads a DCP
checkpoint never pays for its import (issue 43), and DCP's errors are recognised without it.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from launcher.checkpoint.space import is_disk_full, no_space_left, written_path

DCP_API = "torch.distributed.checkpoint.api"
"""The module that defines DCP's CheckpointException."""


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


def is_dcp_error(exc: BaseException) -> bool:
    """DCP's gathered error (CheckpointException, a BaseException), recognised without importing
    DCP: a process that has not imported it cannot have raised it."""
    api = sys.modules.get(DCP_API)
    return api is not None and isinstance(exc, api.CheckpointException)


def attempt(write: Callable[[], None]) -> BaseException | None:
    """Run `write`; its error is returned, not raised (an Exception, or DCP's gathered error),
    for `agree` to share with the other ranks. An abort (KeyboardInterrupt, SystemExit) passes."""
    try:
        write()
    except BaseException as exc:
        if isinstance(exc, Exception) or is_dcp_error(exc):
            return exc
        raise
    return None


def agree(
    error: BaseException | None,
    tmp: Path,
    run_dir: Path,
    device: torch.device,
    is_main: bool,
    group: dist.ProcessGroup | None = None,
) -> None:
    """Collective over `group`: go on when every rank's write into `tmp` succeeded; otherwise
    rank 0 removes the partial save and every rank raises (NoSpaceLeft when the disk is full)."""
    status = 0 if error is None else 2 if is_disk_full(error, tmp.parent) else 1
    status = worst_status(status, device, group)
    if status == 0:
        return
    if is_main:
        shutil.rmtree(tmp, ignore_errors=True)
    if status == 2:
        raise no_space_left(written_path(error, tmp), run_dir) from None
    if error is not None:
        raise error
    raise RuntimeError(f"saving {tmp} failed on another rank (its error is reported there).")
