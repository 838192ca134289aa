"""The segments of a recompute policy: runs of consecutive blocks, each kept, recomputed as one
unit, or selectively recomputed (launcher/recompute/policies.py and wrap.py install them;
estimate.py prices them)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from torch import nn

from launcher.config.ac import AcPolicy


class SegmentMode(str, Enum):
    keep = "keep"
    """Run normally: every activation is saved for backward."""
    full = "full"
    """Checkpoint the segment: keep its input only, rerun its forward in backward."""
    selective = "selective"
    """Checkpoint with an op policy: keep matmul/attention outputs, recompute the cheap ops."""


@dataclass(frozen=True)
class Segment:
    """Blocks [start, stop) run as one unit in one mode."""

    start: int
    stop: int
    mode: SegmentMode

    @property
    def size(self) -> int:
        return self.stop - self.start


def sqrt_segment_size(n_layer: int) -> int:
    """Blocks per sqrt segment: about sqrt(L), so both the kept segment inputs (L/k) and the one
    segment recomputed at a time (k blocks) grow like sqrt(L) (Chen et al. 2016)."""
    return max(1, round(math.sqrt(n_layer)))


def plan_segments(policy: AcPolicy, n_layer: int, every_n: int = 2) -> tuple[Segment, ...]:
    """The segments of a policy for `n_layer` blocks, in order, covering every block once."""
    if policy == AcPolicy.none:
        modes = [SegmentMode.keep] * n_layer
    elif policy == AcPolicy.full:
        modes = [SegmentMode.full] * n_layer
    elif policy == AcPolicy.selective:
        modes = [SegmentMode.selective] * n_layer
    elif policy == AcPolicy.every_n:
        # Blocks 0, n, 2n, ... : ceil(L/n) of them, so n=1 is `full` and the count falls with n.
        modes = [SegmentMode.full if i % every_n == 0 else SegmentMode.keep for i in range(n_layer)]
    elif policy == AcPolicy.sqrt:
        k = sqrt_segment_size(n_layer)
        return tuple(
            Segment(i, min(i + k, n_layer), SegmentMode.full) for i in range(0, n_layer, k)
        )
    else:  # pragma: no cover - AcPolicy is a closed enum
        raise ValueError(f"unknown activation-checkpoint policy {policy!r}")
    return _merge_kept(modes)


def _merge_kept(modes: Sequence[SegmentMode]) -> tuple[Segment, ...]:
    """One segment per recomputed block; consecutive kept blocks merged into one segment."""
    segments: list[Segment] = []
    for i, mode in enumerate(modes):
        if mode == SegmentMode.keep and segments and segments[-1].mode == SegmentMode.keep:
            segments[-1] = Segment(segments[-1].start, i + 1, mode)
        else:
            segments.append(Segment(i, i + 1, mode))
    return tuple(segments)


def uses_dropout(blocks: nn.Module) -> bool:
    return any(isinstance(m, nn.Dropout) and m.p > 0 for m in blocks.modules())
