"""Progress of the end-of-training exact-match evaluation (rank 0): a redrawn bar on a terminal,
a plain line every tenth of the problems otherwise, like the training steps' lines."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import TextIO


class EvalProgress:
    def __init__(
        self,
        total: int,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.total, self.done = total, 0
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty() and os.environ.get("TERM") != "dumb"
        self.every = max(1, total // 10)
        self.clock = clock
        self.start = clock()

    def advance(self, finished: int) -> None:
        """`finished` more problems decoded."""
        if not finished:
            return
        before, self.done = self.done, self.done + finished
        elapsed = self.clock() - self.start
        eta = elapsed * (self.total - self.done) / self.done
        text = f"eval {self.done}/{self.total} problems, {elapsed:.1f}s, eta {eta:.0f}s"
        if self.tty:
            filled = 24 * self.done // self.total
            self.stream.write(f"\r[{'#' * filled}{'.' * (24 - filled)}] {text}\x1b[K")
            if self.done == self.total:
                self.stream.write("\n")
        elif self.done // self.every != before // self.every or self.done == self.total:
            self.stream.write(text + "\n")
        self.stream.flush()
