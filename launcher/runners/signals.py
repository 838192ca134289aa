"""In `launch`, while torchrun runs: relay stop signals to the ranks (launcher/worker/stop.py has
what a rank does with them)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from types import FrameType

import psutil

from launcher.logs import get_logger
from launcher.worker.stop import STOP_SIGNALS, handling_signals

log = get_logger("stop")


class SignalForwarder:
    """Relays SIGTERM/SIGUSR1 from `launch` to the rank processes (torchrun's children).

    Not to torchrun itself: torchrun would kill the ranks after 30 s, and it dies on SIGUSR1.
    A second SIGTERM also ends torchrun, so it does not restart ranks that were killed on purpose.
    """

    def __init__(self, torchrun_pid: int) -> None:
        self.torchrun_pid = torchrun_pid
        self.terms = 0

    def _ranks(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.torchrun_pid).children(recursive=False)
        except psutil.NoSuchProcess:
            return []

    def _send(self, pid: int, sig: int) -> None:
        with suppress(ProcessLookupError):
            os.kill(pid, sig)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        del frame
        if signum == signal.SIGHUP:
            signum = signal.SIGTERM
        if signum == signal.SIGTERM:
            self.terms += 1
        ranks = self._ranks()
        if self.terms >= 2 or not ranks:
            # Stop at once (or no rank is running yet). The ranks' second SIGTERM has its default
            # action; torchrun is ended too, so it restarts nothing.
            log.warning("stopping at once.")
            for proc in ranks:
                self._send(proc.pid, signal.SIGTERM)
            self._send(self.torchrun_pid, signal.SIGTERM)
            return
        log.warning(
            f"{signal.Signals(signum).name}: asking the {len(ranks)} rank(s) to stop after the current "
            "step and save a checkpoint (send SIGTERM again to stop at once)."
        )
        for proc in ranks:
            self._send(proc.pid, signum)


@contextmanager
def forward_stop_signals(torchrun_pid: int) -> Iterator[SignalForwarder]:
    """In `launch`, while torchrun runs: relay stop signals to the ranks. A hang-up (the terminal
    closed) is relayed as SIGTERM, since torchrun runs in its own session and would not see it."""
    forwarder = SignalForwarder(torchrun_pid)
    with handling_signals((*STOP_SIGNALS, signal.SIGHUP), forwarder._handle):
        yield forwarder
