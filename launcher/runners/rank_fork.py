"""Ranks forked from the agent's process, with torch and the worker already imported.

torchrun starts each rank as `python -u -m launcher.worker CONFIG`: a new interpreter that
imports torch, the worker and torch._dynamo (which every optimizer step imports) before its first
step, 2.5-3 CPU-seconds a rank. The agent runs in `launch` (or a SLURM node's task), which has
imported torch already: here it imports the rest once and forks each rank from itself, and the
rank runs the same `launcher.worker` main with the same arguments and environment. torchrun's
agent sees a process it can poll, wait for and signal as it does its own (its
`SubprocessHandler._popen` is the one seam replaced), so restarts, failures and signals behave
the same.

Forking is used only where it is safe: on Linux; no CUDA device (the CUDA driver does not
survive a fork); nothing trained in this process before (`trained_here`: a sweep's in-process
point leaves DeepSpeed's patches, compiled code and OpenMP's threads behind); a probe child that
can run torch's threads; no redirected rank output; this torch still having the seam. Otherwise
torchrun execs as usual. LAUNCHER_RANK_START=exec asks for exec'd ranks everywhere. What the
child does to be a fresh rank: launcher/runners/rank_child.py.

A forked rank is named `rank<N>` (`ps -o comm`, `top`); its command line is its parent's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import import_module
from typing import Any

RANK_START_ENV = "LAUNCHER_RANK_START"
"""`exec`: torchrun's own way, a new interpreter per rank; `fork`, `auto` or unset: fork where
safe; anything else is refused before the launch (`rank_start`)."""
_RANK_STARTS = ("", "auto", "fork", "exec")

FORKED: dict[int, dict[str, str]] = {}
"""pid -> the rank's torchrun variables (RANK, LOCAL_RANK, WORLD_SIZE) of every rank forked by
this process: a forked rank's /proc environ is its parent's, so the launcher asks here."""

PROBE_TIMEOUT_S = 2.0
_RANK_KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE")
_THREADS_BROKEN = False
"""Set once a probe failed: torch's threads, once started here, stay."""
_TRAINED_HERE = False
_OWN_CODE = ("launcher.", "torch.")


def rank_environment(pid: int) -> dict[str, str] | None:
    """The torchrun variables of a rank this process forked, None for any other process."""
    return FORKED.get(pid)


def rank_start() -> str:
    """LAUNCHER_RANK_START, checked: `exec`, or `fork` (where safe; also for `auto` or unset)."""
    value = os.environ.get(RANK_START_ENV, "").strip().lower()
    if value not in _RANK_STARTS:
        from launcher.errors import EnvironmentProblem

        raise EnvironmentProblem(
            f"{RANK_START_ENV}={os.environ[RANK_START_ENV]!r} is not a way to start ranks "
            f"(exec, fork or auto). Fix: `export {RANK_START_ENV}=exec` (each rank a new "
            f"interpreter, as torchrun does) or `unset {RANK_START_ENV}` (forked from `launch` "
            "where safe)."
        )
    return "exec" if value == "exec" else "fork"


def fork_possible() -> bool:
    """Whether ranks may be forked here (module docstring)."""
    global _THREADS_BROKEN
    if rank_start() == "exec" or _TRAINED_HERE:
        return False
    if not sys.platform.startswith("linux") or _THREADS_BROKEN:
        return False  # elsewhere a fork after torch's import is unsafe, PDEATHSIG missing
    from torch.distributed.elastic.multiprocessing.subprocess_handler import SubprocessHandler

    if not callable(getattr(SubprocessHandler, "_popen", None)):
        return False
    import torch

    if torch.cuda.is_initialized() or torch.cuda.is_available():
        return False
    _THREADS_BROKEN = not threads_survive_fork()
    return not _THREADS_BROKEN


def trained_here() -> None:
    """This process is about to train (an in-process run: a sweep's dp=1 point, `launch verify`'s
    reference): ranks it starts later are exec'd, not forked with what training leaves behind
    (DeepSpeed's patches of torch, compiled code, a tracker's globals, OpenMP's threads)."""
    global _TRAINED_HERE
    _TRAINED_HERE = True


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
        code = 1
        try:
            from launcher.lifetime import die_with_parent

            die_with_parent(parent=parent)  # a hung probe never outlives this process
            torch.set_num_threads(2)
            torch.ones(1 << 17).add_(1)  # over ATen's grain size: a parallel region
            code = 0
        finally:
            os._exit(code)
    probe = ForkedRank(pid, ("probe",))
    try:
        return probe.wait(timeout_s) == 0
    except subprocess.TimeoutExpired:
        return False
    finally:
        if probe.poll() is None:
            os.kill(pid, signal.SIGKILL)
            probe.wait()


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


def preload(module: str, argv: list[str] | None = None) -> None:
    """Import once, in this process, what every rank imports (forked ranks inherit it)."""
    import torch._dynamo  # noqa: F401  (every optimizer step imports it)

    import_module("launcher.worker.run")  # training's, and what `launch verify`'s ranks build on
    import_module(module)
    engine = (_rank_config(argv or []) or {}).get("engine") or {}
    if isinstance(engine, dict) and engine.get("name") == "deepspeed":
        from launcher.engines.deepspeed import preload_deepspeed

        preload_deepspeed()  # 2 CPU-seconds once here, rather than in every rank


@contextmanager
def forking_ranks() -> Iterator[None]:
    """While the agent runs: its launcher worker ranks are forked where `fork_possible` and the
    run has no code of the user's (`runs_user_code`). Decided, and the imports made, when the
    first rank starts: after the rendezvous, which an elastic node must not reach late."""
    from torch.distributed.elastic.multiprocessing.subprocess_handler import SubprocessHandler

    exec_rank = SubprocessHandler._popen
    decided: dict[tuple[str, ...], bool] = {}

    def popen(handler: Any, args: tuple[str, ...], env: dict[str, str]) -> Any:
        found = _worker_of(tuple(args))
        if found is None or getattr(handler, "_stdout", None) or getattr(handler, "_stderr", None):
            return exec_rank(handler, args, env)
        module, argv = found
        key = (module, *argv)
        if key not in decided:
            decided[key] = fork_possible() and not runs_user_code(argv)
            if decided[key]:
                preload(module, argv)
        if not decided[key]:
            return exec_rank(handler, args, env)
        return _fork(module, argv, env, tuple(args))

    SubprocessHandler._popen = popen  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        SubprocessHandler._popen = exec_rank  # type: ignore[method-assign]


def runs_user_code(argv: list[str]) -> bool:
    """Whether the rank's config names code of the user's (a `_target_` outside the launcher and
    torch), or this process imported a module from its working directory: importing it here,
    for the plan, ran its import-time code in `launch` (a thread it starts, a hook it registers,
    the environment it reads); a rank of its own imports it again, as an exec'd one does."""
    import launcher

    here = os.getcwd() + os.sep
    # Not the user's: the Python installation, and this package (an editable install's, and
    # `python -m launcher.cli`'s __main__).
    ours = (sys.prefix, sys.base_prefix, os.path.dirname(launcher.__file__))
    skip = tuple({os.path.join(path, "") for path in ours})
    for module in list(sys.modules.values()):
        origin = getattr(module, "__file__", None) or ""
        if origin.startswith(here) and not origin.startswith(skip):
            return True
    tree = _rank_config(argv)
    if tree is None:
        return True
    return any(not target.startswith(_OWN_CODE) for target in _targets(tree))


def _rank_config(argv: list[str]) -> dict[str, Any] | None:
    """The ranks' config.yaml as written (unresolved), None where there is none or it is unread."""
    config = argv[-1] if argv and argv[-1].endswith((".yaml", ".yml")) else None
    if config is None:
        return None
    try:
        from omegaconf import OmegaConf

        tree = OmegaConf.to_container(OmegaConf.load(config), resolve=False)
    except Exception:
        return None
    return {str(key): value for key, value in tree.items()} if isinstance(tree, dict) else None


def _targets(tree: Any) -> Iterator[str]:
    if isinstance(tree, dict):
        for key, value in tree.items():
            if key == "_target_" and isinstance(value, str) and value:
                yield value
            else:
                yield from _targets(value)
    elif isinstance(tree, list):
        for value in tree:
            yield from _targets(value)


def _fork(module: str, argv: list[str], env: dict[str, str], args: tuple[str, ...]) -> ForkedRank:
    from launcher.runners.rank_child import become_rank

    for stream in (sys.stdout, sys.stderr):
        stream.flush()  # or the rank would write this process's pending output again
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(ready_r)
            become_rank(module, argv, env, ready_w)
        finally:
            os._exit(1)  # never back into the agent's code
    os.close(ready_w)
    try:
        os.read(ready_r, 1)  # EOF once the rank leads its own session: killpg finds it
    finally:
        os.close(ready_r)
    FORKED[pid] = {key: env[key] for key in _RANK_KEYS if key in env}
    return ForkedRank(pid, args)
