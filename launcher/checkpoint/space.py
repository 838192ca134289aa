"""A full disk while the run writes its files: one line that names the file being written and the
last complete checkpoint, instead of the writers' chained tracebacks.

A full disk does not always surface as ENOSPC: torch.save's zip writer reports a short write as
"unexpected pos". So a failed write counts as a full disk when an ENOSPC/EDQUOT error is in its
chain, or when the filesystem it wrote to has (almost) no space left right after the failure.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

from launcher.errors import LauncherError
from launcher.exit_codes import FAILED

NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
LOW_WATER_BYTES = 1 << 20
"""Free space below this after a failed write: the disk is what failed."""


class NoSpaceLeft(LauncherError):
    """A write of the run directory hit a full disk; resuming works once there is space."""

    exit_code = FAILED


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """The exception, its causes and contexts, and the per-rank failures DCP collects."""
    seen: set[int] = set()
    stack: list[object] = [exc]
    while stack:
        item = stack.pop()
        if isinstance(item, tuple) and item:  # DCP's failures: rank -> (exception, stack)
            item = item[0]
        if not isinstance(item, BaseException) or id(item) in seen:
            continue
        seen.add(id(item))
        yield item
        stack += [item.__cause__, item.__context__]
        failures = getattr(item, "failures", None)
        if isinstance(failures, dict):
            stack += list(failures.values())


def no_space_errno(exc: BaseException) -> OSError | None:
    """The ENOSPC/EDQUOT error in exc's chain, if any."""
    for item in _chain(exc):
        if isinstance(item, OSError) and item.errno in NO_SPACE:
            return item
    return None


def free_bytes(directory: Path) -> int | None:
    try:
        stat = os.statvfs(directory)
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize


def is_disk_full(exc: BaseException | None, directory: Path) -> bool:
    """Did a write into `directory` fail (exc; None: it failed on another rank) for lack of
    space?"""
    if exc is not None and no_space_errno(exc) is not None:
        return True
    free = free_bytes(directory)
    return free is not None and free < LOW_WATER_BYTES


def written_path(exc: BaseException | None, default: Path) -> str:
    """The file the failed write was writing, when the error says; else `default`."""
    found = no_space_errno(exc) if exc is not None else None
    if found is not None and found.filename:
        return str(found.filename)
    return str(default)


def no_space_left(path: str | Path, run_dir: Path) -> NoSpaceLeft:
    """The one-line error, naming the last complete checkpoint (found on disk, after the write)."""
    from launcher.checkpoint.files import find_checkpoints

    found = find_checkpoints(run_dir, warn=False)
    last = (
        f"step {found[0].step} ({found[0].path})"
        if found
        else "none yet (a rerun starts from step 1)"
    )
    return NoSpaceLeft(
        f"no space left on device writing {path}; the last complete checkpoint is {last}. "
        "Fix: free space on that disk and run the same command to resume (checkpoint.keep "
        "bounds how many checkpoints the run keeps)."
    )
