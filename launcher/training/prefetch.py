"""The next step's micro-batches, built on a background thread while the current step computes.

A step's batches are this rank's micro-batches of its global batch, collated on the CPU, with
their valid-token counts taken there (so the loop never syncs on the device to count), pinned
when the device is a GPU so that the copies the loop issues are asynchronous (non_blocking).
Which samples a step reads depends on the step number only, so building step k+1 early changes
nothing in what is trained; one worker thread builds at most one step ahead.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from launcher.data.sequence import Batch
from launcher.training.loss import valid_tokens

__all__ = ["Batch", "Prefetcher", "StepBatches"]


@dataclass(frozen=True)
class StepBatches:
    step: int
    batches: list[Batch]
    """(inputs, targets, position_ids) per micro-batch, on the CPU (pinned for a GPU)."""
    valid: list[int]
    """Valid target tokens per micro-batch."""
    per_source: tuple[int, ...] = ()
    """A data.sources mixture: this rank's valid target tokens of the step per source."""


class Prefetcher:
    """`get(k)` returns step k's batches and starts building step k+1 in the background.

    build(k): step k's micro-batches and (a mixture) their valid tokens per source."""

    def __init__(
        self, build: Callable[[int], tuple[list[Batch], tuple[int, ...]]], pin: bool
    ) -> None:
        self._build, self._pin = build, pin
        self._lock = threading.Lock()  # the sampler caches its permutation: one caller at a time
        self._pool: ThreadPoolExecutor | None = None
        self._next: tuple[int, Future[StepBatches]] | None = None

    def build(self, step: int) -> StepBatches:
        """Step `step`'s batches, built in the calling thread."""
        with self._lock:
            batches, per_source = self._build(step)
        if self._pin:
            batches = [b.pin_memory() for b in batches]
        return StepBatches(step, batches, [valid_tokens(b.targets) for b in batches], per_source)

    def get(self, step: int, prefetch_next: bool = True) -> StepBatches:
        ahead, self._next = self._next, None
        ready = ahead[1].result() if ahead is not None and ahead[0] == step else None
        if ready is None:
            ready = self.build(step)
        if prefetch_next:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="prefetch")
            self._next = (step + 1, self._pool.submit(self.build, step + 1))
        return ready

    def wait(self) -> None:
        """Until the step being built in the background is ready (for timing: nothing runs on)."""
        if self._next is not None:
            self._next[1].result()

    def close(self) -> None:
        self._next = None
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
