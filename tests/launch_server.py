"""A warm `launch` for the tests' subprocess launches: `python -m tests.launch_server SOCKET`.

A test that needs `launch` as a process of its own (a deadline, signals, kill -9, several ranks
forked by torchrun's agent, a run that changes its process for good) pays a new interpreter's
start: Python, torch, Hydra and the launcher imported again, 1.5-2.5 CPU-seconds, hundreds of
times a suite. This server imports them once (and what a forked rank imports:
launcher/runners/rank_fork.py's preload) and forks each launch from itself, before it has run
anything: the child is what `python -m launcher.cli ARGS` with the test's directory, environment
and file descriptors would be. tests/served.py is the test's side (a Popen-like handle).

The protocol, one SOCK_SEQPACKET connection per launch: the request (JSON: args, cwd, env,
own_session) with stdin, stdout and stderr as SCM_RIGHTS; the reply, the child's pid, then, once
it has ended, its exit status as Popen's returncode gives it and the CPU-seconds it used. The
server ends when its stdin closes (the test process is gone).
"""

from __future__ import annotations

import gc
import json
import os
import select
import signal
import socket
import sys
import traceback
from contextlib import suppress
from typing import Any, NoReturn

MAX_REQUEST = 1 << 20
COMMAND_LINE_ROOM = 4096
"""The kernel shows one page of a rewritten command line: a longer one is cut there."""
PRELOAD = (
    "torch",
    "torch._dynamo",
    "torch.distributed.run",
    "hydra",
    "launcher.cli",
    "launcher.runners.torchrun",
    "launcher.runners.agent",
    "launcher.worker.__main__",
    "launcher.worker.run",
)
"""What `launch` and its forked ranks import anyway; nothing that changes torch (DeepSpeed) or
reads its environment on import (wandb, transformers): those a launch imports itself."""


def serve(path: str) -> None:
    from importlib import import_module

    for module in PRELOAD:
        import_module(module)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is for the tests, not here
    os.close(os.pidfd_open(os.getpid()))  # Linux 5.3: refused here, not at the first launch
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(64)
    print("ready", flush=True)
    running: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, connection)
    while True:
        readable, _, _ = select.select([0, listener, *running], [], [])
        if 0 in readable and not os.read(0, 1):
            return  # the test process ended; its launches end with their own runs
        if listener in readable:
            conn, _ = listener.accept()
            try:
                started = _start(conn, listener, running)
            except (OSError, ValueError, KeyError):
                traceback.print_exc()  # this request only: the test sees its connection close
                conn.close()
                continue
            if started is not None:
                running[os.pidfd_open(started)] = (started, conn)
        for pidfd in [fd for fd in readable if isinstance(fd, int) and fd in running]:
            pid, conn = running.pop(pidfd)
            os.close(pidfd)
            _, status, usage = os.wait4(pid, 0)
            cpu = usage.ru_utime + usage.ru_stime  # its ranks' too: the launch waited for them
            with suppress(OSError):  # the test stopped waiting
                conn.send(f"{os.waitstatus_to_exitcode(status)} {cpu:.3f}".encode())
            conn.close()


def _start(
    conn: socket.socket, listener: socket.socket, running: dict[int, tuple[int, socket.socket]]
) -> int | None:
    message, fds, _, _ = socket.recv_fds(conn, MAX_REQUEST, 3)
    if len(fds) != 3:
        for fd in fds:
            os.close(fd)
        conn.close()
        return None
    request = json.loads(message)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    started_r, started_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        inherited = [listener.fileno(), *running, *(c.fileno() for _, c in running.values())]
        _become_launch(request, fds, [conn.fileno(), started_r, *inherited], started_w)
    for fd in [*fds, started_w]:
        os.close(fd)
    os.read(started_r, 1)  # EOF once the child has its session, streams and command line
    os.close(started_r)
    conn.send(str(pid).encode())
    return pid


def _become_launch(
    request: dict[str, Any], fds: list[int], server_fds: list[int], started: int
) -> NoReturn:
    """The child: `python -m launcher.cli ARGS` as a new interpreter would run it, then the exit
    a new interpreter makes (exit hooks, streams flushed)."""
    import atexit
    import runpy
    import tempfile
    import threading

    code, interrupted = 1, False
    gc.freeze()  # the server's imports: no collection of this launch walks (and copies) them
    try:
        for fd in server_fds:
            os.close(fd)
        if request["own_session"]:
            os.setsid()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in set(fds):
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        tempfile.tempdir = None  # the server's imports fixed it from the server's TMPDIR
        _as_new_interpreter(request["env"])
        _show_command_line([sys.executable, "-m", "launcher.cli", *request["args"]])
        os.close(started)  # the test's handle returns now, as Popen's returns after the exec
        sys.argv = ["launch", *request["args"]]
        sys.modules.pop("launcher.cli", None)  # run as __main__ only, as `python -m` runs it
        runpy.run_module("launcher.cli", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
    except BaseException as exc:
        sys.excepthook(type(exc), exc, exc.__traceback__)
        interrupted = isinstance(exc, KeyboardInterrupt)
    finally:
        try:  # as the interpreter ends: threads joined, exit hooks, streams flushed
            threading._shutdown()  # type: ignore[attr-defined]
            atexit._run_exitfuncs()
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
            if interrupted:  # then an unhandled Ctrl-C ends the process by SIGINT
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGINT)
        finally:
            os._exit(code)


def _as_new_interpreter(env: dict[str, str]) -> None:
    """Signals as after an exec (handled ones back to default, SIGINT to KeyboardInterrupt, as
    under a test process whose SIGINT is handled);
    torch's thread count as OMP_NUM_THREADS sets it at start-up; `python -m`'s sys.path[0]; no
    module of this harness left (a module from the working directory is the user's code to
    launch: launcher/runners/rank_fork.py's runs_user_code)."""
    from launcher.runners.rank_child import _signals_as_after_exec

    signal.signal(signal.SIGINT, signal.SIG_DFL)  # the server ignores it; the test process not
    _signals_as_after_exec()  # as a forked rank's: the same reset
    threads = env.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        import torch

        torch.set_num_threads(int(threads))
    sys.path[0] = os.getcwd()
    harness = os.path.dirname(os.path.abspath(__file__)) + os.sep
    for name, module in list(sys.modules.items()):
        origin = getattr(module, "__file__", None) or ""
        if name != "__main__" and (name == "tests" or origin.startswith(harness)):
            del sys.modules[name]  # `tests`, and this module as __mp_main__ (multiprocessing's)


def _show_command_line(argv: list[str]) -> None:
    """/proc/PID/cmdline (ps, psutil) as the launch's own, as setproctitle writes it: over this
    process's argument memory (the server starts with COMMAND_LINE_ROOM bytes of it), the command
    joined by spaces, its last byte not NUL (the kernel then reads up to the first NUL)."""
    import ctypes

    with open("/proc/self/stat", "rb") as stat:
        fields = stat.read().rsplit(b")", 1)[1].split()
    start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end: proc(5) fields 48, 49
    room = end - start
    title = " ".join(argv).encode()[: room - 2]
    ctypes.memmove(start, title + b"\0" + b" " * (room - len(title) - 1), room)


if __name__ == "__main__":
    serve(sys.argv[1])
