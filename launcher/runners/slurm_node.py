"""What each node's srun task runs: torchrun (same arguments), adapted to SLURM's signals.

`python -m launcher.runners.slurm_node <torchrun arguments>` runs torchrun's agent in its own
process (launcher/runners/agent.py, as `launch` does) and differs from torchrun in these ways:

- A signal to a SLURM step reaches every process of the step, the ranks included. So the agent
  ignores SIGUSR1 and SIGTERM instead of dying of USR1 or forwarding a second TERM (which a
  rank takes as "stop at once"); it keeps watching the ranks while they save a checkpoint.
- torchrun exits 1 whenever a rank fails. When the ranks stopped with STOPPED_RESUMABLE (saved a
  checkpoint on a stop signal), this exits with that status, so that the batch script can tell a
  preemption (requeue) from a failure (no requeue). A failure names the rank that failed first.
- For the ranks of `launcher.worker`: the first node holds the run directory's lock for the
  job's life (a second job into the directory exits 2 naming the holder; a requeued job takes
  it, the old one being dead), and torchrun's scratch stays in the run directory, removed at the
  end. The ranks die with this process (launcher/worker/__main__.py).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import sys
from collections.abc import Iterable
from contextlib import AbstractContextManager, nullcontext, suppress
from pathlib import Path
from types import FrameType

from launcher.exit_codes import COMPLETE_HELD, FAILED, HUNG, STOPPED_RESUMABLE
from launcher.lifetime import RunDirectoryBusy, RunLock
from launcher.rundir import AGENT_DIR, rank_failures_file

AGENT_IGNORES = (signal.SIGUSR1, signal.SIGTERM)
AGENT_HANDLES = "SIGINT,SIGHUP,SIGQUIT"  # torchrun's default set, less SIGTERM


def resumable(exit_codes: Iterable[int]) -> bool:
    """True when a rank stopped resumably and no rank failed for another reason.

    A rank exits STOPPED_RESUMABLE only after every rank has committed the checkpoint together, so
    one such exit means the run can resume. Once one rank has ended, torchrun ends the others
    (SIGTERM, then SIGKILL); those exits are its cleanup, not failures of their own.
    """
    codes = list(exit_codes)
    cleanup = {-signal.SIGTERM, -signal.SIGKILL}
    return STOPPED_RESUMABLE in codes and all(c == STOPPED_RESUMABLE or c in cleanup for c in codes)


def _ignore(signum: int, frame: FrameType | None) -> None:
    """A handler, not SIG_IGN: handlers are reset in the ranks at exec, SIG_IGN would be
    inherited."""


def torchrun_args(argv: list[str]) -> list[str]:
    """torchrun's arguments, telling it to leave SIGTERM alone where this torch can be told."""
    from launcher.runners.agent import handles_signals_option

    return [f"--signals_to_handle={AGENT_HANDLES}", *argv] if handles_signals_option() else argv


def run_dir_of(argv: list[str]) -> Path | None:
    """The run directory, when the ranks are the launcher's (`-m launcher.worker CONFIG`)."""
    if "launcher.worker" in argv and argv[-1].endswith(".yaml"):
        return Path(argv[-1]).resolve().parent
    return None


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    run_dir = run_dir_of(args)
    first_node = os.environ.get("SLURM_NODEID") == "0"
    lock = RunLock(run_dir) if run_dir is not None and first_node else None
    try:
        if lock is not None:
            lock.acquire()  # before the heavy imports: a refused job ends at once
    except RunDirectoryBusy as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    scratch = run_dir / AGENT_DIR / node if run_dir is not None else None
    try:
        return _run(args, run_dir, node, scratch)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
            with suppress(OSError):
                scratch.parent.rmdir()  # the last node to end
        if lock is not None:
            lock.release()


def _run(args: list[str], run_dir: Path | None, node: str, scratch: Path | None) -> int:
    from launcher.runners.agent import blame, run_agent, write_failures
    from launcher.runners.held import (
        died_after_work,
        died_exit_line,
        hang_exit_line,
        held_exit_line,
        write_held_summary,
    )
    from launcher.runners.watchdog import Watchdog
    from launcher.tracking.run_end import peer_named_hang, write_hung_summary

    for sig in AGENT_IGNORES:
        signal.signal(sig, _ignore)
    log_dir = [f"--log-dir={scratch}"] if scratch is not None else []
    watchdog: AbstractContextManager[object] = (
        Watchdog(run_dir) if run_dir is not None else nullcontext()
    )
    failures = []
    with watchdog:
        failures = run_agent(torchrun_args([*log_dir, *args]))
    held = watchdog.held_complete if isinstance(watchdog, Watchdog) else None
    if held is not None and run_dir is not None:
        summary = write_held_summary(run_dir, held, COMPLETE_HELD)
        print(f"error: {node}: {held_exit_line(held, COMPLETE_HELD, summary)}", file=sys.stderr)
        return COMPLETE_HELD
    if not failures:
        return 0
    died = died_after_work(run_dir, failures) if run_dir is not None and not held else None
    if died is not None and run_dir is not None:
        print(f"error: {node}: {died_exit_line(died, COMPLETE_HELD)}", file=sys.stderr)
        write_held_summary(run_dir, died, COMPLETE_HELD, key="died_after_work")
        return COMPLETE_HELD
    hangs = watchdog.hangs if isinstance(watchdog, Watchdog) else []
    if not hangs and run_dir is not None and not resumable(f.exitcode for f in failures):
        # another node's watchdog may have killed the rank this node's ranks waited on
        hangs = peer_named_hang(run_dir, min(f.timestamp for f in failures))
    if hangs:
        print(f"error: {node}: {hang_exit_line(hangs, HUNG, run_dir)}", file=sys.stderr)
        if run_dir is not None:
            write_hung_summary(run_dir, hangs[-1], HUNG)
        return HUNG
    if resumable(f.exitcode for f in failures):
        print(
            f"launcher: {node}: {len(failures)} rank(s) stopped resumably "
            f"(exit {STOPPED_RESUMABLE})."
        )
        return STOPPED_RESUMABLE
    if run_dir is not None:
        write_failures(rank_failures_file(run_dir, node), failures)
    print(f"error: {node}: {blame(failures, run_dir)}", file=sys.stderr)
    return FAILED


if __name__ == "__main__":
    from launcher.lifetime import exit_now

    exit_now(main())
