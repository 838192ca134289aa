"""Console progress: a redrawn bar on a terminal, plain lines otherwise (rank 0 only).

The ETA comes from the pace of the last `WINDOW` steps, not the average since the start: a run
that slows down (a machine that became busy, a slower phase) shows it within a few steps, and
the first step's warm-up stops counting once it leaves the window.
"""

from __future__ import annotations

import os
import sys
import time
from collections import deque
from collections.abc import Callable
from typing import TextIO

WINDOW = 20
"""Steps whose pace the ETA extrapolates."""


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


class Progress:
    """A one-line progress bar on a terminal; a plain line every `every` steps otherwise."""

    def __init__(
        self,
        total: int,
        every: int,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.total, self.every = total, every
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty() and os.environ.get("TERM") != "dumb"
        self.clock = clock
        self.start = clock()
        self.first_step: int | None = None
        self.marks: deque[tuple[float, int]] = deque(maxlen=WINDOW + 1)
        """(time, steps done) of the recent updates; the oldest is the window's start."""

    def eta(self, done: int) -> float:
        """Seconds left at the pace of the steps in the window (0 when unknown)."""
        (t0, d0), (t1, d1) = self.marks[0], self.marks[-1]
        if t1 <= t0 or d1 <= d0:
            return 0.0
        return (self.total - done) * (t1 - t0) / (d1 - d0)

    def update(
        self,
        done: int,
        loss: float | None,
        tokens_per_s: float,
        mfu: float | None = None,
        memory: int | None = None,
        compile_s: float | None = None,
    ) -> None:
        """`done`: optimizer steps completed (1-based step number); `compile_s`: seconds spent
        compiling, given once, on the first step that compiled (that line is always shown)."""
        if self.first_step is None:
            self.first_step = done - 1
            self.marks.append((self.start, self.first_step))
        self.marks.append((self.clock(), done))
        eta = self.eta(done)
        loss_txt = f"{loss:.4f}" if loss is not None else "skipped"
        text = f"step {done}/{self.total} loss {loss_txt} tok/s {tokens_per_s:,.0f}"
        if mfu is not None:
            text += f" mfu {mfu:.1%}"
        if memory is not None:
            text += f" mem {_gib(memory)}"
        if compile_s is not None:
            text += f" compile {compile_s:.1f}s"
        text += f" eta {eta:.0f}s"
        if self.tty:
            width = 24
            filled = int(width * done / self.total)
            self.stream.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {text}\x1b[K")
            if done == self.total:
                self.stream.write("\n")
            self.stream.flush()
        elif (
            done % self.every == 0
            or done == self.total
            or done - 1 == self.first_step
            or compile_s is not None
        ):
            self.stream.write(text + "\n")
            self.stream.flush()
