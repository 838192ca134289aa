"""One optimizer step's wall time, split into data, waiting on communication, and compute.

What is measurable without a profiler: the time in the collectives the training loop issues
itself (the per-step token-count all-reduce, which also absorbs waiting for the slowest rank,
and the all-reduce of the logged loss), and the time building the step's micro-batches.
Everything else is `compute`, including the engine's gradient reduction, which overlaps backward
and cannot be separated from it by wall-clock timing.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class StepTimes:
    total_s: float
    data_s: float
    comm_s: float

    @property
    def compute_s(self) -> float:
        return max(0.0, self.total_s - self.data_s - self.comm_s)


class StepClock:
    """Started at the top of a step; `section` brackets data or communication; `stop` reads it."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.start = time.perf_counter()
        self.spent = {"data": 0.0, "comm": 0.0}

    def _sync(self) -> None:
        # Kernels run asynchronously: wait for queued work so it is not booked to the section.
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @contextmanager
    def section(self, name: str) -> Iterator[None]:
        if name not in self.spent:
            raise ValueError(f"unknown section {name!r}")
        if name == "comm":
            self._sync()
        began = time.perf_counter()
        try:
            yield
        finally:
            if name == "comm":
                self._sync()
            self.spent[name] += time.perf_counter() - began

    def stop(self) -> StepTimes:
        self._sync()
        return StepTimes(time.perf_counter() - self.start, self.spent["data"], self.spent["comm"])
