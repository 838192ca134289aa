"""What the loop accepts from outside besides the model and data: step callbacks (periodic
checkpoints; the tests' fault injection and pacing) and a stop request (a signal)."""

from __future__ import annotations

from typing import Protocol


class StepCallback(Protocol):
    """Called on every rank around each optimizer step; every rank calls the same callbacks."""

    def before_step(self, step: int) -> None:
        """Step `step` (1-based) is about to run."""

    def after_step(self, step: int) -> None:
        """`step` optimizer steps are done (its metrics may still be in flight)."""


class StopRequest(Protocol):
    """Read at every step boundary; the ranks agree on it through the step's all-reduce."""

    @property
    def requested(self) -> bool: ...
