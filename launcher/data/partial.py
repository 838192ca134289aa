"""The temporary directories a cache is prepared in, beside the cache: `NAME.tmp-PID-RANDOM`.

Each carries a marker naming the machine, the process-id namespace, the process and its start
time. A directory whose process is gone (kill -9, a lost node) is adopted by the next preparation
of the same cache (it resumes where that one stopped) or removed, and only one that this
machine's namespace made and marked: on a shared file system another node's live preparation
looks the same, and a directory without our marker is never touched (a warning names it). Call
these under the cache's lock.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import socket
from pathlib import Path

from launcher.logs import get_logger

log = get_logger("data")

OWNER_FILE = "owner.json"


def _start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot ('' where /proc cannot tell)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[-1].split()[19]  # field 22 of stat, counted after the name


def this_process() -> dict[str, object]:
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        namespace = ""
    pid = os.getpid()
    return {"host": socket.gethostname(), "pid_namespace": namespace, "pid": pid} | {
        "start": _start_time(pid)
    }


def partial_name(final: Path) -> Path:
    """A new name for a partial directory of `final`, this process's."""
    return final.with_name(f"{final.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")


def make_partial(final: Path) -> Path:
    """A new directory beside `final`, marked as this process's."""
    tmp = partial_name(final)
    tmp.mkdir()
    mark(tmp)
    return tmp


def mark(directory: Path) -> None:
    (directory / OWNER_FILE).write_text(json.dumps(this_process()) + "\n", encoding="utf-8")


def left_by_a_dead_process(directory: Path) -> bool:
    """A partial directory marked by a process of this machine's namespace that is gone."""
    marker = directory / OWNER_FILE
    if directory.is_symlink() or not directory.is_dir() or marker.is_symlink():
        return False
    if any(p.is_symlink() for p in directory.iterdir()):
        return False  # we write none: adopting it would truncate and append through the link
    try:
        owner = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    here = this_process()
    if not isinstance(owner, dict) or not isinstance(owner.get("pid"), int):
        return False
    if (owner.get("host"), owner.get("pid_namespace")) != (here["host"], here["pid_namespace"]):
        return False  # another machine's (a shared file system) or another container's
    pid = owner["pid"]
    if pid == here["pid"]:
        return owner.get("start") != here["start"]  # an earlier process with our id
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return bool(owner.get("start")) and owner.get("start") != _start_time(pid)  # id reused


def leftovers(final: Path) -> tuple[list[Path], list[Path]]:
    """(partial directories of `final` left by dead processes of ours, the others) by name."""
    prefix = f"{final.name}.tmp-"
    try:
        names = sorted(n for n in os.listdir(final.parent) if n.startswith(prefix))
    except OSError:
        return [], []
    dead: list[Path] = []
    other: list[Path] = []
    for name in names:
        path = final.parent / name
        (dead if left_by_a_dead_process(path) else other).append(path)
    for path in other:
        log.warning(
            f"{path} is a partial cache that this process did not make and cannot tell is "
            f"abandoned (another machine's, a live process's, or unmarked). If no preparation "
            f"is running, remove it: rm -r {shlex.quote(str(path))}"
        )
    return dead, other
