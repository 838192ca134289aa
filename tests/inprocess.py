"""`launch train|plan|export` inside the test process: the command's own code
(`launcher.cli.main`), its output and exit status as a subprocess would give them, without a
Python start-up per launch (importing torch, DCP and dynamo again costs seconds on CI's two cores;
the suite runs hundreds of launches).

Only where the process boundary is not what a test is about. `run_launch` keeps a subprocess for
the other commands; for environments that must exist before the interpreter starts (PYTHON*,
LD_*); for runs that would change this process for good by training in it (DeepSpeed replaces
torch functions process-wide, wandb keeps a service process, compilation keeps caches); for
several ranks (torchrun's agent forks them from the process it runs in, which must be a
`launch` of its own, not this one with every earlier test's state: launcher/runners/rank_fork.py);
and for a launch given a deadline (a hung process can be killed, this one cannot). Signals,
kill -9 and background runs use `BackgroundLaunch`, a real process. LAUNCHER_TESTS_SUBPROCESS=1
runs every launch as a subprocess (to tell a test's failure from this harness's).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import torch

from tests.served import read_output

COMMANDS = ("train", "plan", "export")
_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGHUP, signal.SIGQUIT)
_PROCESS_WIDE = ("deepspeed", "train.compile=true", "train.compile=True")
"""Words of a run that changes its process for good when it trains in it (one rank)."""


def _trains_here(args: list[str]) -> bool:
    """Whether `launch train` would train in its own process: one rank, no SLURM (else the ranks
    are torchrun's or the cluster's processes and this one only runs torchrun's agent)."""
    sizes = [a for a in args if a.startswith(("parallel.dp=", "parallel.nodes="))]
    # A sweep's `parallel.dp=1,2` trains its first point here.
    several = any("1" not in a.partition("=")[2].split(",") for a in sizes)
    return args[0] == "train" and not several and "cluster=slurm" not in args


def runs_in_process(args: list[str], env: dict[str, str], wanted: bool | None = None) -> bool:
    """Whether this launch can share the test process (see the module doc). wanted=True: the
    caller knows its environment matters to the ranks only (they inherit it from here)."""
    if os.environ.get("LAUNCHER_TESTS_SUBPROCESS") == "1" or wanted is False:
        return False
    if not args or args[0] not in COMMANDS:
        return False
    if wanted is None and any(key.startswith(("PYTHON", "LD_")) for key in env):
        return False
    if args[0] == "train" and "wandb.mode=disabled" not in args:
        return False  # wandb's service process and global run (`plan` never starts wandb)
    if args[0] == "train" and "cluster=slurm" not in args and not _trains_here(args):
        return False  # torchrun's agent would fork the ranks from this process, with its state
    if not _trains_here(args):
        return True
    return not any(word in arg for arg in args for word in _PROCESS_WIDE)


@contextmanager
def _process_state(cwd: Path, env: dict[str, str]) -> Iterator[None]:
    """What a run may change in this process, put back afterwards: environment, directory,
    argv, signal handlers, torch's thread count and the launcher's log handlers."""
    environ, argv, here = dict(os.environ), list(sys.argv), os.getcwd()
    handlers = {sig: signal.getsignal(sig) for sig in _SIGNALS}
    threads = torch.get_num_threads()
    logger = logging.getLogger("launcher")
    log_state = (list(logger.handlers), logger.level, logger.propagate)
    os.environ.update(env)
    os.chdir(cwd)
    try:
        yield
    finally:
        os.chdir(here)
        os.environ.clear()
        os.environ.update(environ)
        sys.argv[:] = argv
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        torch.set_num_threads(threads)
        logger.handlers[:], logger.level, logger.propagate = log_state


@contextmanager
def _output_to(out: IO[bytes], err: IO[bytes]) -> Iterator[None]:
    """stdout and stderr of this process, and of the processes it starts (torchrun's ranks), into
    `out` and `err`: the file descriptors are swapped, and sys.stdout/stderr write to them."""
    streams = (sys.stdout, sys.stderr)
    for stream in streams:
        stream.flush()
    saved = (os.dup(1), os.dup(2))
    os.dup2(out.fileno(), 1)
    os.dup2(err.fileno(), 2)
    sys.stdout = open(os.dup(1), "w", buffering=1, encoding="utf-8", errors="replace")  # noqa: SIM115
    sys.stderr = open(os.dup(2), "w", buffering=1, encoding="utf-8", errors="replace")  # noqa: SIM115
    try:
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.close()
        sys.stdout, sys.stderr = streams
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])


def launch_in_process(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[int, str, str]:
    """`launch <argv>` run by `launcher.cli.main` here: (exit status, stdout, stderr)."""
    from hydra.core.global_hydra import GlobalHydra

    from launcher.cli import main

    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        # Ranks that torchrun's agent starts from here (a sweep's dp>1 point) are exec'd: forked,
        # they would inherit this test process's state (launcher/runners/rank_fork.py).
        env = {"LAUNCHER_RANK_START": "exec", **env}
        with _process_state(cwd, env), _output_to(out, err):
            GlobalHydra.instance().clear()
            code = 0
            try:
                main(list(argv))
            except SystemExit as exc:
                if exc.code is None or isinstance(exc.code, int):
                    code = exc.code or 0
                else:  # as the interpreter does: the message on stderr, status 1
                    print(exc.code, file=sys.stderr)
                    code = 1
            except Exception:  # as the interpreter does: the traceback, status 1
                traceback.print_exc()
                code = 1
            finally:
                GlobalHydra.instance().clear()
        return code, read_output(out), read_output(err)


def completed(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    code, stdout, stderr = launch_in_process(argv, cwd, env)
    return subprocess.CompletedProcess(["launch", *argv], code, stdout, stderr)
