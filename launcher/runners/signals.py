"""In `launch`, while torchrun's agent runs in it: relay stop signals to the ranks
(launcher/worker/stop.py has what a rank does with them).

The ranks are children of `launch` in sessions of their own (torchrun starts them so), so a
signal for `launch` (a terminal's Ctrl-C or hang-up, `kill`) reaches each rank once, from here.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from types import FrameType

import psutil

from launcher.logs import get_logger
from launcher.runners.held import Work, training_over
from launcher.worker.heartbeat import FINAL_SAVE, SAVE_WRITTEN
from launcher.worker.stop import CTRL_C_STOPPING, STOP_SIGNALS, handling_signals

log = get_logger("stop")


class StopAtOnce(Exception):
    """Raised in the main thread on a second SIGTERM, or on the first once training is over on
    every rank (`work`: what the run saved): it ends torchrun's agent, which then restarts
    nothing."""

    def __init__(self, work: Work | None = None) -> None:
        super().__init__()
        self.work = work


def worker_processes() -> list[psutil.Process]:
    """This process's children that are ranks (`python -m launcher.worker ...`, or forked by
    launcher/runners/rank_fork.py)."""
    from launcher.runners.rank_fork import rank_environment

    ranks = []
    for child in psutil.Process().children(recursive=False):
        with suppress(psutil.Error):
            if rank_environment(child.pid) is not None or "launcher.worker" in child.cmdline():
                ranks.append(child)
    return ranks


def _send(procs: list[psutil.Process], sig: int) -> None:
    for proc in procs:
        with suppress(ProcessLookupError):
            os.kill(proc.pid, sig)


class SignalForwarder:
    """Relays SIGTERM/SIGUSR1/SIGINT (and a hang-up, as SIGTERM) from `launch` to the ranks.

    The first SIGTERM, SIGUSR1 or Ctrl-C asks the ranks to stop after the current step and save a
    checkpoint; a SIGTERM once every rank is past its last step (training is over: no step to
    finish, no save to ask for) ends them at once (SIGKILL, a stopped one too) and the agent
    (StopAtOnce with the run's work). A second SIGTERM stops them at once (their SIGTERM has its
    default action by then) and ends the agent (StopAtOnce); a second Ctrl-C kills them and
    raises KeyboardInterrupt (`launch` exits 130). Either, with no rank running yet, stops at
    once.
    """

    def __init__(self, run_dir: Path | None = None) -> None:
        self.run_dir = run_dir
        self.terms = 0
        self.interrupts = 0

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        del frame
        if signum == signal.SIGHUP:
            signum = signal.SIGTERM
        ranks = worker_processes()
        if signum == signal.SIGINT:
            self.interrupts += 1
            if self.interrupts >= 2 or not ranks:
                _send(ranks, signal.SIGKILL)
                raise KeyboardInterrupt
            log.warning(CTRL_C_STOPPING)
            _send(ranks, signal.SIGINT)
            return
        if signum == signal.SIGTERM:
            self.terms += 1
            if self.terms >= 2 or not ranks:
                log.warning("stopping at once.")
                _send(ranks, signal.SIGTERM)
                raise StopAtOnce
            over = training_over(self.run_dir, ranks) if self.run_dir is not None else None
            if over is not None and over[1] & {FINAL_SAVE, SAVE_WRITTEN}:  # it would be lost
                log.warning(
                    "SIGTERM: training is over on every rank; letting the final save finish, "
                    "then the ranks exit (send SIGTERM again to stop at once, without it)."
                )
                return
            if over is not None:  # no step to finish, no save to make: a stopped rank too
                log.warning(
                    f"SIGTERM: training is over on every rank (all past their last step and the "
                    f"final save): ending the {len(ranks)} rank(s) still running now; "
                    f"{over[0].work()}."
                )
                _send(ranks, signal.SIGKILL)
                raise StopAtOnce(over[0])
        log.warning(
            f"{signal.Signals(signum).name}: asking the {len(ranks)} rank(s) to stop after the "
            "current step and save a checkpoint (send SIGTERM again to stop at once)."
        )
        _send(ranks, signum)


@contextmanager
def forward_stop_signals(run_dir: Path | None = None) -> Iterator[SignalForwarder]:
    """In `launch`, while the agent runs: relay stop signals to the ranks (run_dir: where their
    heartbeats say whether training is over)."""
    forwarder = SignalForwarder(run_dir)
    with handling_signals((*STOP_SIGNALS, signal.SIGHUP), forwarder._handle):
        yield forwarder
