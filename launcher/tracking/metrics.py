"""One optimizer step as metrics.jsonl records it, and the run's totals over those steps."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

METRIC_KEYS = (
    "step",
    "loss",
    "tokens",
    "rank_tokens_min",
    "rank_tokens_max",
    "padding_fraction",
    "lr",
    "grad_norm",
    "tokens_per_s",
    "step_time_s",
    "compute_s",
    "comm_wait_s",
    "data_s",
    "mfu",
    "peak_memory_bytes",
    "peak_rss_bytes",
    "skipped",
    "val_loss",
)
"""Every metrics.jsonl line carries these keys (null where not applicable); see docs/tracking.md.
A data.sources mixture adds tokens/NAME per source (its valid target tokens of the step), a
pipeline run (parallel.pp > 1) pp_bubble."""

SOURCE_PREFIX = "tokens/"
BUBBLE_KEY = "pp_bubble"
"""A pipeline run's lines add it: the last stage's measured idle share of the step."""


def finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def clean(values: dict[str, Any]) -> dict[str, Any]:
    """JSON-safe: NaN and infinities become null."""
    return {k: (finite(v) if isinstance(v, float) else v) for k, v in values.items()}


@dataclass(frozen=True)
class StepMetrics:
    """The host-side figures of one finished optimizer step (what the loop hands the tracker)."""

    step: int
    """1-based: optimizer steps done after this one."""
    loss: float | None
    """Global token mean of the step's loss; None when the step was skipped (no valid token)."""
    tokens: int
    rank_tokens_min: int
    rank_tokens_max: int
    padding_fraction: float
    lr: float
    grad_norm: float | None
    step_time_s: float
    data_s: float = 0.0
    comm_wait_s: float = 0.0
    val_loss: float | None = None
    """The validation loss measured after this step (eval.every); None on other steps."""
    source_tokens: dict[str, int] | None = None
    pp_bubble: float | None = None
    """parallel.pp > 1: the last stage's measured idle share of the step (its mean over the
    data-parallel streams); None without a pipeline (no key in the line)."""
    """A data.sources mixture: the step's valid target tokens per source name."""
    compile_s: float = 0.0
    """Of step_time_s, the seconds this step spent compiling (train.compile)."""

    @property
    def skipped(self) -> bool:
        return self.loss is None

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.step_time_s if self.step_time_s > 0 else 0.0

    @property
    def compute_s(self) -> float:
        return max(0.0, self.step_time_s - self.data_s - self.comm_wait_s)

    def line(
        self, mfu: float | None, peak_memory_bytes: int | None, peak_rss_bytes: int | None = None
    ) -> dict[str, Any]:
        """The metrics.jsonl line, keys in METRIC_KEYS order, NaN as null. peak_memory_bytes:
        peak tensor memory (null on CPU until the first steps' measurement closes)."""
        values = {
            "step": self.step,
            "loss": self.loss,
            "tokens": self.tokens,
            "rank_tokens_min": self.rank_tokens_min,
            "rank_tokens_max": self.rank_tokens_max,
            "padding_fraction": self.padding_fraction,
            "lr": self.lr,
            "grad_norm": self.grad_norm,
            "tokens_per_s": self.tokens_per_s,
            "step_time_s": self.step_time_s,
            "compute_s": self.compute_s,
            "comm_wait_s": self.comm_wait_s,
            "data_s": self.data_s,
            "mfu": mfu,
            "peak_memory_bytes": peak_memory_bytes,
            "peak_rss_bytes": peak_rss_bytes,
            "skipped": self.skipped,
            "val_loss": self.val_loss,
        }
        for name, count in (self.source_tokens or {}).items():
            values[SOURCE_PREFIX + name] = count
        if self.pp_bubble is not None:
            values[BUBBLE_KEY] = round(self.pp_bubble, 4)
        return clean(values)


@dataclass
class RunTotals:
    """Sums over the run's optimizer steps; a resumed run starts from its checkpoint's totals."""

    steps: int = 0
    tokens: int = 0
    positions: int = 0
    seconds: float = 0.0
    data_s: float = 0.0
    comm_wait_s: float = 0.0
    final_loss: float | None = None
    rank_tokens_min: int | None = None
    rank_tokens_max: int | None = None
    final_val_loss: float | None = None
    source_tokens: dict[str, int] = field(default_factory=dict)
    """A data.sources mixture: valid target tokens per source name, over the run."""

    def add(self, m: StepMetrics, positions: int) -> None:
        self.steps += 1
        self.tokens += m.tokens
        self.positions += positions
        self.seconds += m.step_time_s
        self.data_s += m.data_s
        self.comm_wait_s += m.comm_wait_s
        if m.loss is not None:
            self.final_loss = m.loss
        if m.val_loss is not None:
            self.final_val_loss = m.val_loss
        for name, count in (m.source_tokens or {}).items():
            self.source_tokens[name] = self.source_tokens.get(name, 0) + count
        low, high = self.rank_tokens_min, self.rank_tokens_max
        self.rank_tokens_min = m.rank_tokens_min if low is None else min(low, m.rank_tokens_min)
        self.rank_tokens_max = m.rank_tokens_max if high is None else max(high, m.rank_tokens_max)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def compute_s(self) -> float:
        return max(0.0, self.seconds - self.data_s - self.comm_wait_s)

    @property
    def padding_fraction(self) -> float | None:
        return 1.0 - self.tokens / self.positions if self.positions else None

    @classmethod
    def from_saved(cls, saved: dict[str, Any]) -> RunTotals:
        """The totals a checkpoint's meta.json holds (unknown keys ignored)."""
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in saved.items() if k in names})
