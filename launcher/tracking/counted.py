"""Progress of a counted piece of work on a stream (problems scored, prompts generated): a
redrawn bar on a terminal, a plain line every tenth of the total otherwise."""

from __future__ import annotations

import os
from typing import TextIO


class CountedProgress:
    def __init__(self, total: int, stream: TextIO) -> None:
        self.total, self.done = total, 0
        self.stream = stream
        self.tty = self.stream.isatty() and os.environ.get("TERM") != "dumb"
        self.every = max(1, total // 10)
        self.before = 0

    def count(self, finished: int) -> bool:
        """Add `finished`; whether there is anything to say."""
        if not finished:
            return False
        self.before, self.done = self.done, self.done + finished
        return True

    def say(self, text: str) -> None:
        """The bar and `text` on a terminal; otherwise `text` when a tenth more is done."""
        if self.tty:
            filled = 24 * self.done // self.total
            self.stream.write(f"\r[{'#' * filled}{'.' * (24 - filled)}] {text}\x1b[K")
            if self.done == self.total:
                self.stream.write("\n")
        elif self.done // self.every != self.before // self.every or self.done == self.total:
            self.stream.write(text + "\n")
        self.stream.flush()
