"""Graceful stop on SIGTERM/SIGUSR1: a flag the training loop reads at optimizer-step boundaries.

The handlers only record that a stop was asked for; the loop folds the flag into the per-step
token-count all-reduce, so every rank stops after the same step, saves a checkpoint together,
and the job exits with STOPPED_RESUMABLE (75). Nothing is done inside the handler.

A second SIGTERM stops at once: after the first one, SIGTERM gets its default action back, so the
kernel ends the process even while it is blocked in a collective or a write. SIGUSR1 (SLURM's
usual "time is nearly up" warning) only asks; a SIGTERM after it still counts as the first.
Ctrl-C (SIGINT) is a stop like SIGTERM; a second Ctrl-C raises KeyboardInterrupt (Python's own
handler is back after the first), which `launch` reports as an abort, exit 130.

`launch` runs torchrun's ranks in sessions of their own and forwards the signals it receives to
the ranks (launcher/runners/signals.py), so each rank gets each signal once.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from launcher.lifetime import AGENT_PID_ENV
from launcher.logs import get_logger

log = get_logger("stop")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
CTRL_C_STOPPING = (
    "Ctrl-C: stopping after this step and saving a checkpoint; press Ctrl-C again to abort."
)


class StopFlag:
    """Set by a stop signal; read by the loop at step boundaries."""

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self.signals_received = 0
        """Every stop signal counts, the first and those after it (a wait that a new signal
        ends compares this)."""

    @property
    def requested(self) -> bool:
        return self.signal_name is not None

    def request(self, name: str) -> None:
        self.signal_name = self.signal_name or name

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        del frame
        self.signals_received += 1
        if signum == signal.SIGTERM:
            # The next SIGTERM kills at once, whatever the process is doing.
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        elif signum == signal.SIGINT:
            # The next Ctrl-C aborts: KeyboardInterrupt, which `launch` turns into exit 130.
            signal.signal(signal.SIGINT, signal.default_int_handler)
        if not self.requested:
            self.request(signal.Signals(signum).name)
            if signum == signal.SIGINT and AGENT_PID_ENV in os.environ:
                return  # relayed by `launch`, which said it on the terminal already
            log.info(stopping_message(signum))  # rank 0 speaks for all


SLURM_STEP_ENV = "SLURM_STEP_ID"
"""Set in the processes of a SLURM job step (srun): the ranks of train.sbatch."""
SLURM_TERM = (
    "SIGTERM from SLURM: it is ending this job step (the job was cancelled, preempted or out of "
    "time, or one of its nodes failed). Saving a checkpoint after the current optimizer step if "
    "every rank gets there; if a node failed, the ranks there are gone and nothing is saved now: "
    "train.sbatch runs the step again on the nodes left (an elastic job) or SLURM requeues the "
    "job, and either resumes from the newest complete checkpoint."
)


def stopping_message(signum: int) -> str:
    """What rank 0 says on the first stop signal. A SIGTERM inside a SLURM step comes from SLURM
    itself (train.sbatch relays its own stops as SIGUSR1): it may be a node failure, where no
    checkpoint can be saved, and sending another SIGTERM is not the user's to do."""
    if signum == signal.SIGINT:
        return CTRL_C_STOPPING
    if signum == signal.SIGTERM and SLURM_STEP_ENV in os.environ:
        return SLURM_TERM
    return (
        f"{signal.Signals(signum).name}: stopping after the current optimizer step, saving a "
        "checkpoint (send SIGTERM again to stop at once)."
    )


@contextmanager
def handling_signals(signals: tuple[signal.Signals, ...], handler: Any) -> Iterator[None]:
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
    with handling_signals(STOP_SIGNALS, flag._handle):
        yield flag


STEP_RELAUNCHES_ENV = "LAUNCHER_STEP_RELAUNCHES"
"""Set by train.sbatch: how many times it ran the training step again after a lost node."""


def torchrun_restarts() -> int:
    """torchrun's restart count for this worker within its step (0: torchrun's first start)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)


def restart_attempt() -> int:
    """How many times this job's ranks started before in this allocation (0: the first attempt):
    torchrun's restarts, plus train.sbatch's relaunches of the step after a lost node."""
    return torchrun_restarts() + int(os.environ.get(STEP_RELAUNCHES_ENV, "0") or 0)


def requeued_by_slurm() -> bool:
    """A SLURM job running again after a requeue: it continues the run, whatever train.resume
    says."""
    return int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0) > 0
