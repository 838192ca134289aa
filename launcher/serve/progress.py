"""Progress of an offline generation on stderr: a redrawn bar on a terminal, a line every tenth
otherwise; then the totals."""

from __future__ import annotations

import sys
from typing import TextIO

from launcher.tracking.counted import CountedProgress


class GenerationProgress(CountedProgress):
    def __init__(self, total: int, stream: TextIO | None = None) -> None:
        super().__init__(total, stream or sys.stderr)

    def advance(self, finished: int, tokens: int) -> None:
        if self.count(finished):
            self.say(f"generated {self.done}/{self.total} requests, {tokens} tokens")
