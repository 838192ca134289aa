"""Graceful stop on SIGTERM/SIGUSR1: a flag the training loop reads at optimizer-step boundaries.

The handlers only record that a stop was asked for; the loop folds the flag into the per-step
token-count all-reduce, so every rank stops after the same step, saves a checkpoint together,
and the job exits with STOPPED_RESUMABLE (75). Nothing is done inside the handler.

A second SIGTERM stops at once: after the first one, SIGTERM gets its default action back, so the
kernel ends the process even while it is blocked in a collective or a write. SIGUSR1 (SLURM's
usual "time is nearly up" warning) only asks; a SIGTERM after it still counts as the first.

`launch` itself runs the ranks under torchrun in a session of their own and forwards the signals
it receives to the ranks (`forward_stop_signals`), so each rank gets each signal once.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from types import FrameType
from typing import Any

import psutil

from launcher.logs import get_logger

log = get_logger("stop")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
STOPPED_FILE = "stopped.json"
"""Written by rank 0 after a graceful stop: the step and the checkpoint to resume from."""


class StopFlag:
    """Set by a stop signal; read by the loop at step boundaries."""

    def __init__(self) -> None:
        self.signal_name: str | None = None

    @property
    def requested(self) -> bool:
        return self.signal_name is not None

    def request(self, name: str) -> None:
        self.signal_name = self.signal_name or name

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        del frame
        if signum == signal.SIGTERM:
            # The next SIGTERM kills at once, whatever the process is doing.
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if not self.requested:
            self.request(signal.Signals(signum).name)
            log.info(  # rank 0 speaks for all
                f"{self.signal_name}: stopping after the current optimizer step, saving a checkpoint "
                "(send SIGTERM again to stop at once)."
            )


@contextmanager
def _handling(signals: tuple[signal.Signals, ...], handler: Any) -> Iterator[None]:
    """Install `handler` for `signals` (main thread only: Python delivers signals there) and
    restore the previous handlers afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in signals}
    for sig in signals:
        signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextmanager
def stop_on_signals() -> Iterator[StopFlag]:
    """The stop handlers of one rank, for the duration of its run."""
    flag = StopFlag()
    with _handling(STOP_SIGNALS, flag._handle):
        yield flag


# --- the stopped marker: how `launch` and restarted ranks learn that a stop was deliberate -------


def write_stopped(run_dir: Path, step: int, checkpoint: Path | None, reason: str | None) -> None:
    info = {"step": step, "checkpoint": str(checkpoint) if checkpoint else None, "signal": reason}
    tmp = run_dir / (STOPPED_FILE + ".tmp")
    tmp.write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    tmp.replace(run_dir / STOPPED_FILE)


def read_stopped(run_dir: Path) -> dict[str, Any] | None:
    try:
        info = json.loads((run_dir / STOPPED_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def clear_stopped(run_dir: Path) -> None:
    (run_dir / STOPPED_FILE).unlink(missing_ok=True)


def restart_attempt() -> int:
    """torchrun's restart count for this worker (0: the job's first attempt)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)


def requeued_by_slurm() -> bool:
    """A SLURM job running again after a requeue: it continues the run, whatever train.resume says."""
    return int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0) > 0


# --- in `launch`: forward stop signals to the ranks under torchrun -------------------------------


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
    with _handling((*STOP_SIGNALS, signal.SIGHUP), forwarder._handle):
        yield forwarder
