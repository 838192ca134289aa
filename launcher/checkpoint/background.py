"""The finishing half of an asynchronous checkpoint (checkpoint.async=true), off the training
thread: wait for DCP's writer, agree across ranks, write the completion record, rename into
place, prune. At most one is in flight; the Checkpointer waits for it before the next save, at
the end of training, and (for a while) when training fails.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import TYPE_CHECKING

import torch.distributed as dist

from launcher.logs import get_logger

if TYPE_CHECKING:
    from launcher.worker.stop import StopFlag

log = get_logger("checkpoint")

FAILURE_WAIT_S = 300.0
"""How long a rank that fails lets the asynchronous save in flight finish before it exits: its
state was copied before the failure, and the ranks' writer threads agree among themselves."""


def checkpoint_group() -> dist.ProcessGroup | None:
    """Collective: a gloo group for the background writer's collectives, which run while the
    training thread uses the default group (two threads must never share one group's
    collectives). None without a process group."""
    if not dist.is_initialized():
        return None
    return dist.new_group(backend="gloo")


class BackgroundSave:
    """One save being finished in a daemon thread (a rank that fails elsewhere is not held at
    exit by it); `wait` re-raises its error on the training thread."""

    def __init__(self, step: int, final: Path, finish: Callable[[], None]) -> None:
        self.step, self.final = step, final
        self._done: Future[None] = Future()
        self._thread = threading.Thread(
            target=self._run, args=(finish,), name=f"checkpoint-step-{step}", daemon=True
        )
        self._thread.start()

    def _run(self, finish: Callable[[], None]) -> None:
        try:
            finish()
        except BaseException as exc:  # handed to the training thread by wait()
            self._done.set_exception(exc)
        else:
            self._done.set_result(None)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the save is finished (True) or `timeout` seconds pass (False); the save's
        error is raised here."""
        try:
            self._done.result(timeout)
        except FutureTimeout:
            return False
        return True

    def wait_unless(self, timeout: float, give_up: Callable[[], bool]) -> bool:
        """Block until the save is finished (True), `timeout` seconds pass or `give_up()` turns
        true (False, checked four times a second); the save's error is raised here."""
        deadline = time.monotonic() + timeout
        while not self.wait(min(0.25, max(0.0, deadline - time.monotonic()))):
            if give_up() or time.monotonic() >= deadline:
                return False
        return True


def finish_after_failure(
    pending: BackgroundSave, failure: BaseException, stop: StopFlag | None, timeout: float
) -> bool:
    """Training failed on this rank (`failure`): let `pending` finish (at most `timeout`
    seconds, or until a stop signal arrives) so that the newest state copied before the failure
    is kept. True when it did. Its own error is logged, never raised over the failure's; only a
    second Ctrl-C (KeyboardInterrupt) gets out. The failing rank speaks, whichever it is: this is
    its error path."""
    step = pending.step
    lines = str(failure).strip().splitlines()
    what = type(failure).__name__ + (f": {lines[0][:200]}" if lines else "")
    log.warning(
        f"training failed ({what}); finishing the checkpoint of step {step} first (at most "
        f"{timeout:.0f}s; Ctrl-C abandons it, and the checkpoint before it stays)."
    )
    signals_before = stop.signals_received if stop is not None else 0
    asked = lambda: stop is not None and stop.signals_received > signals_before  # noqa: E731
    try:
        finished = pending.wait_unless(timeout, asked)
    except Exception as exc:  # the failure that ends the run is the one to raise
        log.warning(f"the checkpoint of step {step} was not saved: {exc}")
        return False
    if not finished:
        why = "abandoned" if asked() else f"not finished in {timeout:.0f}s"
        log.warning(
            f"the checkpoint of step {step} was {why}: it stays incomplete, and a resume uses "
            "the one before it."
        )
        return False
    log.info(f"the checkpoint of step {step} is complete: {pending.final}")
    return True
