"""Progress of an offline generation on stderr: a redrawn bar on a terminal, a line every tenth
otherwise; then the totals."""

from __future__ import annotations

import os
import sys
from typing import TextIO


class GenerationProgress:
    def __init__(self, total: int, stream: TextIO | None = None) -> None:
        self.total, self.done = total, 0
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() and os.environ.get("TERM") != "dumb"
        self.every = max(1, total // 10)

    def advance(self, finished: int, tokens: int) -> None:
        if not finished:
            return
        before, self.done = self.done, self.done + finished
        text = f"generated {self.done}/{self.total} requests, {tokens} tokens"
        if self.tty:
            filled = 24 * self.done // self.total
            self.stream.write(f"\r[{'#' * filled}{'.' * (24 - filled)}] {text}\x1b[K")
            if self.done == self.total:
                self.stream.write("\n")
        elif self.done // self.every != before // self.every or self.done == self.total:
            self.stream.write(text + "\n")
        self.stream.flush()
