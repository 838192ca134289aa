"""The hidden siblings an export writes beside its output: `.NAME.partial-PID` while the weights
are written, `.NAME.old-PID` for the directory being replaced, for the moment of the swap.

A partial directory carries a file naming the machine, the process-id namespace and the process
that made it. The next export to the same output removes a partial directory whose process is
gone (kill -9, a lost node), and only one that this machine's namespace made and marked: on a
shared file system another node's live export looks the same. A `.NAME.old-PID` is never
touched (it may be the only copy of what was replaced): a warning names it and what to do.
Exports to one output take turns through a lock on the parent directory.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

from launcher.errors import ConfigError
from launcher.logs import get_logger

log = get_logger("export")

KEY = "--output"
OWNER_FILE = ".launcher_export_owner"  # in a partial directory: who is writing it
PARTIAL, OLD = "partial", "old"
SUFFIX_BYTES = 20  # "." before the name, ".partial-" and a process id after it


def sibling(path: Path, kind: str, pid: int | None = None) -> Path:
    return path.with_name(f".{path.name}.{kind}-{os.getpid() if pid is None else pid}")


@contextlib.contextmanager
def output_lock(path: Path) -> Iterator[None]:
    """Exports to outputs in one directory take turns (flock on the directory itself: no file
    is created for it)."""
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _this_process() -> dict[str, object]:
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        namespace = ""
    return {"host": socket.gethostname(), "pid_namespace": namespace, "pid": os.getpid()}


def make_partial(path: Path) -> Path:
    """A new partial directory beside `path`, marked as this process's (call under output_lock)."""
    tidy_leftovers(path)
    tmp = sibling(path, PARTIAL)
    try:
        tmp.mkdir()
    except FileExistsError:
        raise ConfigError(
            KEY,
            f"{tmp} exists, and this export did not make it.",
            f"move or delete {shlex.quote(str(tmp))}, then export again.",
        ) from None
    fd = os.open(tmp / OWNER_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(_this_process()) + "\n")
    return tmp


def _left_by_a_dead_export(directory: Path, pid: int) -> bool:
    """A partial directory this module made on this machine, whose process is gone."""
    marker = directory / OWNER_FILE
    if directory.is_symlink() or not directory.is_dir() or marker.is_symlink():
        return False
    try:
        owner = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    here = _this_process()
    if not isinstance(owner, dict) or owner.get("pid") != pid or pid == here["pid"]:
        return False
    if (owner.get("host"), owner.get("pid_namespace")) != (here["host"], here["pid_namespace"]):
        return False  # another machine's (a shared file system) or another container's
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def tidy_leftovers(path: Path) -> None:
    """What killed exports to `path` left beside it (call under output_lock)."""
    prefix = f".{path.name}."
    try:
        names = [name for name in os.listdir(path.parent) if name.startswith(prefix)]
    except OSError:
        return
    for name in sorted(names):
        kind, _, pid = name[len(prefix) :].partition("-")
        if not pid.isdigit():
            continue
        leftover = path.parent / name
        if kind == PARTIAL and _left_by_a_dead_export(leftover, int(pid)):
            shutil.rmtree(leftover)
            log.info(f"removed {leftover}, left by a killed export (process {pid}).")
        elif kind == OLD and int(pid) != os.getpid():
            log.warning(
                f"{leftover} holds what an export (process {pid}) was replacing when it was "
                f"stopped. If {path} is missing, it is your earlier export: mv "
                f"{shlex.quote(str(leftover))} {shlex.quote(str(path))}; otherwise remove it: "
                f"rm -r {shlex.quote(str(leftover))}"
            )


def finish_partial(path: Path) -> None:
    """`path` is the partial directory renamed into place: its marker goes."""
    (path / OWNER_FILE).unlink(missing_ok=True)
