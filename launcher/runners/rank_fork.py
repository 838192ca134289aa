"""Ranks forked from the agent's process, with torch and the worker already imported.

torchrun starts each rank as `python -u -m launcher.worker CONFIG`: a new interpreter that
imports torch, the worker and torch._dynamo (which every optimizer step imports) before its first
step, 2.5-3 CPU-seconds a rank. The agent runs in `launch` (or a SLURM node's task), which has
imported torch already: here it imports the rest once and forks each rank from itself, and the
rank runs the same `launcher.worker` main with the same arguments and environment. torchrun's
agent sees a process it can poll, wait for and signal as it does its own (its
`SubprocessHandler._popen` is the one seam replaced), so restarts, failures and signals behave
the same.

Forking is used only where it is safe: no CUDA device (the CUDA driver does not survive a fork),
threads that work in a forked child (not so once torch computed in this process: a probe child
tries),
no redirected rank output, and this torch still having the seam; otherwise torchrun execs as
usual. LAUNCHER_RANK_START=exec asks for the exec'd ranks everywhere (docs/development.md).

A forked rank is named `rank<N>` (`ps -o comm`, `top`); its command line is its parent's.
"""

from __future__ import annotations

import atexit
import ctypes
import io
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import import_module
from typing import Any, NoReturn

RANK_START_ENV = "LAUNCHER_RANK_START"
"""`exec`: torchrun's own way, a new interpreter per rank; anything else: fork where safe."""

FORKED: dict[int, dict[str, str]] = {}
"""pid -> the rank's torchrun variables (RANK, LOCAL_RANK, WORLD_SIZE) of every rank forked by
this process: a forked rank's /proc environ is its parent's, so the launcher asks here."""

_PR_SET_NAME = 15
PROBE_TIMEOUT_S = 2.0
_RANK_KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE")
_THREADS_BROKEN = False
"""Set once a probe failed: torch's threads, once started here, stay."""


def rank_environment(pid: int) -> dict[str, str] | None:
    """The torchrun variables of a rank this process forked, None for any other process."""
    return FORKED.get(pid)


def fork_possible() -> bool:
    """Whether ranks may be forked here (module docstring)."""
    if os.environ.get(RANK_START_ENV, "").strip().lower() == "exec":
        return False
    from torch.distributed.elastic.multiprocessing.subprocess_handler import SubprocessHandler

    if not callable(getattr(SubprocessHandler, "_popen", None)) or not hasattr(os, "fork"):
        return False
    import torch

    global _THREADS_BROKEN
    if torch.cuda.is_available() or _THREADS_BROKEN:
        return False
    _THREADS_BROKEN = not threads_survive_fork()
    return not _THREADS_BROKEN


class ForkedRank:
    """What torchrun's agent uses of a `subprocess.Popen`: pid, poll, wait, signals."""

    def __init__(self, pid: int, args: tuple[str, ...]) -> None:
        self.pid = pid
        self.args = args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: its status is lost
                self.returncode = 1
                return self.returncode
            if pid == self.pid:
                self.returncode = os.waitstatus_to_exitcode(status)
                FORKED.pop(self.pid, None)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.001
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(list(self.args), timeout or 0.0)
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def threads_survive_fork(timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether a child forked from this process can run torch's threads: once torch computed
    here (an in-process run of a sweep, a test process), OpenMP's pool is memory without threads
    in a child, whose first parallel region then waits forever. A probe child tries one."""
    import torch

    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    parent, pid = os.getpid(), os.fork()
    if pid == 0:
        try:
            from launcher.lifetime import die_with_parent

            die_with_parent(parent=parent)  # a hung probe never outlives this process
            torch.set_num_threads(2)
            torch.ones(1 << 17).add_(1)  # over ATen's grain size: a parallel region
        finally:
            os._exit(0)
    probe = ForkedRank(pid, ("probe",))
    try:
        return probe.wait(timeout_s) == 0
    except subprocess.TimeoutExpired:
        os.kill(pid, signal.SIGKILL)
        probe.wait()
        return False


def _worker_of(args: tuple[str, ...]) -> tuple[str, list[str]] | None:
    """(module, its arguments) when the command is `python [-u] -m launcher...worker ARGS`."""
    if len(args) < 3 or args[0] != sys.executable or "-m" not in args[1:3]:
        return None
    at = args.index("-m")
    if any(flag != "-u" for flag in args[1:at]) or at + 1 >= len(args):
        return None
    module = args[at + 1]
    if not (module.startswith("launcher.") and module.endswith("worker")):
        return None
    return module, list(args[at + 2 :])


def preload(module: str) -> None:
    """Import once, in this process, what every rank imports (forked ranks inherit it)."""
    import torch._dynamo  # noqa: F401  (every optimizer step imports it)

    import_module("launcher.worker.run")  # training's, and what `launch verify`'s ranks build on
    import_module(module)


@contextmanager
def forking_ranks(worker: str) -> Iterator[bool]:
    """While the agent runs: fork its `worker` ranks (True) where `fork_possible`."""
    if not fork_possible():
        yield False
        return
    from torch.distributed.elastic.multiprocessing.subprocess_handler import SubprocessHandler

    preload(worker)
    exec_rank = SubprocessHandler._popen

    def popen(handler: Any, args: tuple[str, ...], env: dict[str, str]) -> Any:
        found = _worker_of(tuple(args))
        if found is None or getattr(handler, "_stdout", None) or getattr(handler, "_stderr", None):
            return exec_rank(handler, args, env)
        return _fork(found[0], found[1], env, tuple(args))

    SubprocessHandler._popen = popen  # type: ignore[method-assign,assignment]
    try:
        yield True
    finally:
        SubprocessHandler._popen = exec_rank  # type: ignore[method-assign]


def _fork(module: str, argv: list[str], env: dict[str, str], args: tuple[str, ...]) -> ForkedRank:
    for stream in (sys.stdout, sys.stderr):
        stream.flush()  # or the rank would write this process's pending output again
    pid = os.fork()
    if pid == 0:
        _become_rank(module, argv, env)
    FORKED[pid] = {key: env[key] for key in _RANK_KEYS if key in env}
    return ForkedRank(pid, args)


def _become_rank(module: str, argv: list[str], env: dict[str, str]) -> NoReturn:
    """The forked child: what a new `python -u -m MODULE ARGV` with `env` would be, then its main.
    Never returns into the agent's code."""
    code = 1
    try:
        os.setsid()  # as torchrun's Popen(start_new_session=True): the agent signals the group
        _as_new_interpreter(module, argv, env)
        from launcher.worker.__main__ import main

        code = main(argv, worker=module)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        from launcher.lifetime import exit_now

        exit_now(code)


def _as_new_interpreter(module: str, argv: list[str], env: dict[str, str]) -> None:
    # The parent's handlers, exit hooks and buffered streams are the parent's business.
    for sig in signal.valid_signals():
        handler = signal.getsignal(sig)
        if callable(handler) and sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
    signal.set_wakeup_fd(-1)
    clear_exit_hooks = getattr(atexit, "_clear", None)
    if clear_exit_hooks is not None:
        clear_exit_hooks()
    os.environ.clear()
    os.environ.update(env)
    sys.stdout, sys.stderr = _unbuffered(1, sys.stdout), _unbuffered(2, sys.stderr)
    main_module = f"{module}.__main__" if module == "launcher.worker" else module
    sys.argv = [getattr(import_module(main_module), "__file__", None) or module, *argv]
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)  # as `python -m` puts it there
    threads = env.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        import torch

        torch.set_num_threads(int(threads))  # read once at start-up by a new interpreter
    try:
        name = f"rank{env.get('RANK', '')}".encode()[:15]
        ctypes.CDLL(None).prctl(_PR_SET_NAME, ctypes.c_char_p(name), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _unbuffered(fd: int, like: Any) -> io.TextIOWrapper:
    """A text stream on `fd` as `python -u` makes one (no buffer between it and the descriptor)."""
    return io.TextIOWrapper(
        io.FileIO(fd, "w", closefd=False),
        encoding=getattr(like, "encoding", None) or "utf-8",
        errors=getattr(like, "errors", None) or "strict",
        write_through=True,
    )
