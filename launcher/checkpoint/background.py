"""The finishing half of an asynchronous checkpoint (checkpoint.async=true), off the training
thread: wait for DCP's writer, agree across ranks, write the completion record, rename into
place, prune. At most one is in flight; the Checkpointer waits for it before the next save and
at the end of training.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

import torch.distributed as dist


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

    def wait(self) -> None:
        self._done.result()
