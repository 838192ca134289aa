"""The pipeline's bubble as a rank lives it: the share of a schedule step spent outside its
stages' work (waiting for the previous stage's activations or the next one's gradients, the
pipeline's fill and drain).

Busy is the time inside each stage's `forward_one_chunk`, `backward_one_chunk` and
`backward_weight_one_chunk` and the loss function: torch's schedules call these between their
sends and receives, so what is left of `step()` is waiting and the schedule's own bookkeeping.
On CUDA the calls return before their kernels finish, so each is timed by events on the current
stream and read once after the step; on CPU by the host clock.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

TIMED_METHODS = ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk")


class _Span:
    """One timed interval: CUDA events on the current stream, else the host clock."""

    def __init__(self, cuda: bool) -> None:
        self._events: tuple[Any, Any] | None = None
        self._start = self._end = 0.0
        if cuda:
            self._events = (
                torch.cuda.Event(enable_timing=True),
                torch.cuda.Event(enable_timing=True),
            )
            self._events[0].record()
        else:
            self._start = time.perf_counter()

    def close(self) -> None:
        if self._events is not None:
            self._events[1].record()
        else:
            self._end = time.perf_counter()

    def seconds(self) -> float:
        """After close (on CUDA, after the stream passed the end event)."""
        if self._events is not None:
            self._events[1].synchronize()
            return float(self._events[0].elapsed_time(self._events[1])) / 1000
        return self._end - self._start


class BubbleClock:
    """Wraps `stages`' work methods and a loss function; `step()` times one schedule step and
    sets `share`, the step's idle share (None before a step)."""

    def __init__(self, stages: Sequence[Any], cuda: bool) -> None:
        self.cuda = cuda
        self.share: float | None = None
        self._busy: list[_Span] = []
        for stage in stages:
            for name in TIMED_METHODS:
                method = getattr(stage, name, None)
                if method is not None:
                    setattr(stage, name, self.timed(method))

    def timed(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            span = _Span(self.cuda)
            try:
                return fn(*args, **kwargs)
            finally:
                span.close()
                self._busy.append(span)

        return run

    @contextmanager
    def step(self) -> Iterator[None]:
        self._busy = []
        whole = _Span(self.cuda)
        yield
        whole.close()
        total = whole.seconds()
        busy = sum(span.seconds() for span in self._busy)
        self.share = max(0.0, 1.0 - busy / total) if total > 0 else None
