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
from types import FrameType

import psutil

from launcher.logs import get_logger
from launcher.worker.stop import CTRL_C_STOPPING, STOP_SIGNALS, handling_signals

log = get_logger("stop")


class StopAtOnce(Exception):
    """Raised in the main thread on a second SIGTERM: it ends torchrun's agent, which then
    restarts nothing."""


def worker_processes() -> list[psutil.Process]:
    """This process's children that are ranks (`python -m launcher.worker ...`)."""
    ranks = []
    for child in psutil.Process().children(recursive=False):
        with suppress(psutil.Error):
            if "launcher.worker" in child.cmdline():
                ranks.append(child)
    return ranks


def _send(procs: list[psutil.Process], sig: int) -> None:
    for proc in procs:
        with suppress(ProcessLookupError):
            os.kill(proc.pid, sig)


class SignalForwarder:
    """Relays SIGTERM/SIGUSR1/SIGINT (and a hang-up, as SIGTERM) from `launch` to the ranks.

    The first SIGTERM, SIGUSR1 or Ctrl-C asks the ranks to stop after the current step and save a
    checkpoint. A second SIGTERM stops them at once (their SIGTERM has its default action by then)
    and ends the agent (StopAtOnce); a second Ctrl-C kills them and raises KeyboardInterrupt
    (`launch` exits 130). Either, with no rank running yet, stops at once.
    """

    def __init__(self) -> None:
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
        log.warning(
            f"{signal.Signals(signum).name}: asking the {len(ranks)} rank(s) to stop after the "
            "current step and save a checkpoint (send SIGTERM again to stop at once)."
        )
        _send(ranks, signum)


@contextmanager
def forward_stop_signals() -> Iterator[SignalForwarder]:
    """In `launch`, while the agent runs: relay stop signals to the ranks."""
    forwarder = SignalForwarder()
    with handling_signals((*STOP_SIGNALS, signal.SIGHUP), forwarder._handle):
        yield forwarder
