"""One optimizer step's wall time, split into data, waiting on communication, and compute.

No clock call synchronises with the device. A step is timed on the host from the moment the
loop starts it to the moment its optimizer step is queued; in between the host waits once, for
the step's counts all-reduce (launcher/training/loop.py), and on a GPU that wait also lasts until
the device has finished the previous step. So in steady state the host's step time equals the
device's, without a torch.cuda.synchronize of our own.

What is measurable without a profiler: `data`, the time waiting for the step's micro-batches
(built one step ahead on a background thread, so normally only the copy being queued), and
`comm`, the time blocked in the loop's own collective (the counts all-reduce, which also absorbs
waiting for the slowest rank, and on a GPU the device catching up) or in the final loss flush.
Everything else is `compute`, including the engine's gradient reduction, which overlaps backward
and cannot be separated from it by wall-clock timing. With train.compile, `compile_s` is what
dynamo and inductor spent inside the step (their own clock, read at its start and end): the step
that paid a compilation carries it, whichever step is logged when (the loop logs step k after
queueing step k+1).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class StepTimes:
    total_s: float
    data_s: float
    comm_s: float
    compile_s: float = 0.0
    """Of total_s, the seconds spent compiling (train.compile; 0 otherwise)."""

    @property
    def compute_s(self) -> float:
        return max(0.0, self.total_s - self.data_s - self.comm_s)


class StepClock:
    """Started at the top of a step; `section` brackets data or communication; `stop` reads it.
    `compiled`: seconds compiled so far in this process (launcher/worker/compile.py), if any."""

    def __init__(self, compiled: Callable[[], float] | None = None) -> None:
        self.compiled = compiled
        self.compiled_before = compiled() if compiled is not None else 0.0
        self.start = time.perf_counter()
        self.spent = {"data": 0.0, "comm": 0.0}

    @contextmanager
    def section(self, name: str) -> Iterator[None]:
        if name not in self.spent:
            raise ValueError(f"unknown section {name!r}")
        began = time.perf_counter()
        try:
            yield
        finally:
            self.spent[name] += time.perf_counter() - began

    def stop(self) -> StepTimes:
        total = time.perf_counter() - self.start
        compiled = self.compiled() - self.compiled_before if self.compiled is not None else 0.0
        return StepTimes(total, self.spent["data"], self.spent["comm"], compiled)
