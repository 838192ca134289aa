"""Progress of the end-of-training exact-match evaluation (rank 0): a redrawn bar on a terminal,
a plain line every tenth of the problems otherwise, like the training steps' lines."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

from launcher.tracking.counted import CountedProgress


class EvalProgress(CountedProgress):
    def __init__(
        self,
        total: int,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        super().__init__(total, stream or sys.stdout)
        self.clock = clock
        self.start = clock()

    def advance(self, finished: int) -> None:
        """`finished` more problems decoded."""
        if not self.count(finished):
            return
        elapsed = self.clock() - self.start
        eta = elapsed * (self.total - self.done) / self.done
        self.say(f"eval {self.done}/{self.total} problems, {elapsed:.1f}s, eta {eta:.0f}s")
