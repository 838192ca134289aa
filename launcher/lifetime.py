"""Tie every process of a run to the run: one holder of a run directory at a time, and ranks that
die with the process that started them.

The lock is an exclusive `flock` on `<run dir>/.lock`. The kernel releases it when the last open
copy of its file descriptor closes, so a crash (even kill -9) never leaves it stuck, and the
launcher hands the descriptor down to torchrun and the ranks: the directory stays locked until the
last process of the run has ended, not just `launch`. The file itself holds who took it (pid,
host, SLURM job) so that a refused second run can name the holder.

The parent-death signal (Linux `prctl(PR_SET_PDEATHSIG)`) makes the kernel kill torchrun when
`launch` dies and a rank when torchrun dies, so that killing `launch` never leaves ranks training
on in the background.
"""

from __future__ import annotations

import atexit
import ctypes
import fcntl
import json
import os
import signal
import socket
import sys
from contextlib import suppress
from pathlib import Path
from typing import Any, NoReturn

from launcher.errors import LauncherError
from launcher.logs import mark
from launcher.rundir import LOCK_FILE
from launcher.userpath import open_own

_PR_SET_PDEATHSIG = 1
AGENT_PID_ENV = "LAUNCHER_AGENT_PID"
"""In a rank's environment: the pid of torchrun's agent (`launch`, or slurm_node on a SLURM node),
the parent whose death ends the rank (launcher/worker/__main__.py)."""


class RunDirectoryBusy(LauncherError):
    """Another run holds the run directory."""


def _holder(path: Path) -> dict[str, Any]:
    try:
        info = json.loads(path.read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def _describe(info: dict[str, Any]) -> str:
    if not info:
        return "another process"
    words = f"pid {info.get('pid')} on {info.get('host')}"
    if info.get("slurm_job"):
        words += f" (SLURM job {info['slurm_job']})"
    if info.get("job"):
        words += f", {info['job']}"
    return words


class RunLock:
    """The exclusive lock of one run directory; `fd` is what child processes inherit."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / LOCK_FILE
        self.fd: int | None = None
        self.job: str | None = None
        """What else the holder is, in words (cluster=torchrun: node 0 of a job whose other nodes
        use the directory without the lock); a refused run names it."""

    def acquire(self) -> RunLock:
        """Take the lock or raise RunDirectoryBusy naming the holder. Never blocks."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = open_own(self.path, flags=os.O_RDWR, mode=0o644)  # never through a link
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RunDirectoryBusy(
                f"hydra.run.dir: {self.path.parent} is in use by a run that is still going "
                f"({_describe(_holder(self.path))}). Fix: wait for it to end or stop it (Ctrl-C "
                "or SIGTERM saves a checkpoint), or pick another run directory "
                "(hydra.run.dir=...)."
            ) from None
        os.set_inheritable(fd, True)
        info = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "slurm_job": os.environ.get("SLURM_JOB_ID"),
            **({"job": self.job} if self.job else {}),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
        self.fd = fd
        return self

    def release(self) -> None:
        """Close this process's copy; the lock is free once every inheriting child has exited."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> RunLock:
        return self.acquire() if self.fd is None else self

    def __exit__(self, *exc: object) -> None:
        self.release()


def die_with_parent(sig: signal.Signals = signal.SIGKILL, parent: int | None = None) -> None:
    """Ask the kernel to send `sig` to this process when its parent exits (Linux; a no-op
    elsewhere). Safe in a `preexec_fn`. If the parent is already gone (`parent`: the pid it must
    be, when known; else the parent at the time of the call), die now.

    The kernel sends the signal when the *thread* that started this process ends: start it from
    the thread that lives as long as the process should (torchrun's agent: the main thread)."""
    parent = os.getppid() if parent is None else parent
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before prctl took effect
        os.kill(os.getpid(), sig)


def exit_now(code: int) -> NoReturn:
    """End this process with `code` as a normal exit does (atexit handlers: wandb's teardown,
    logging's flush; then stdout and stderr flushed), but without the interpreter's own shutdown,
    which for a process that imported torch takes seconds of garbage collection and finalising
    modules and does nothing a run needs. For `launch` and the ranks, after their work is done."""
    with suppress(Exception):  # a closed stderr must not keep this process alive
        mark("exit")
    run_exit_handlers = getattr(atexit, "_run_exitfuncs", None)
    if run_exit_handlers is not None:
        with suppress(Exception):
            run_exit_handlers()
    for stream in (sys.stdout, sys.stderr):
        with suppress(Exception):
            stream.flush()
    os._exit(code)
