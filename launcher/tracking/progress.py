"""Console progress: a redrawn bar on a terminal, plain lines otherwise (rank 0 only)."""

from __future__ import annotations

import os
import sys
import time
from typing import TextIO


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


class Progress:
    """A one-line progress bar on a terminal; a plain line every `every` steps otherwise."""

    def __init__(self, total: int, every: int, stream: TextIO | None = None) -> None:
        self.total, self.every = total, every
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty() and os.environ.get("TERM") != "dumb"
        self.start = time.perf_counter()
        self.first_step: int | None = None

    def update(
        self,
        done: int,
        loss: float | None,
        tokens_per_s: float,
        mfu: float | None = None,
        memory: int | None = None,
    ) -> None:
        """`done`: optimizer steps completed (1-based step number)."""
        if self.first_step is None:
            self.first_step = done - 1
        elapsed = time.perf_counter() - self.start
        rate = (done - self.first_step) / elapsed if elapsed > 0 else 0.0
        eta = (self.total - done) / rate if rate > 0 else 0.0
        loss_txt = f"{loss:.4f}" if loss is not None else "skipped"
        text = f"step {done}/{self.total} loss {loss_txt} tok/s {tokens_per_s:,.0f}"
        if mfu is not None:
            text += f" mfu {mfu:.1%}"
        if memory is not None:
            text += f" mem {_gib(memory)}"
        text += f" eta {eta:.0f}s"
        if self.tty:
            width = 24
            filled = int(width * done / self.total)
            self.stream.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {text}\x1b[K")
            if done == self.total:
                self.stream.write("\n")
            self.stream.flush()
        elif done % self.every == 0 or done == self.total or done - 1 == self.first_step:
            self.stream.write(text + "\n")
            self.stream.flush()
