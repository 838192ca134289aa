"""What a run reports: metrics.jsonl, summary.json and console progress (rank 0 only)."""

from __future__ import annotations

import json
import math
import os
import resource
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import torch

from launcher.logs import get_logger

log = get_logger("tracking")

METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"


def peak_memory_bytes(device: torch.device) -> int:
    """torch.cuda.max_memory_allocated on GPU; peak resident set size of this process on CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


class Progress:
    """A one-line progress bar on a terminal; a plain line every `every` steps otherwise."""

    def __init__(self, total: int, every: int, stream: TextIO | None = None) -> None:
        self.total, self.every = total, every
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty() and os.environ.get("TERM") != "dumb"
        self.start = time.perf_counter()
        self.first_step: int | None = None

    def update(self, done: int, loss: float | None, tokens_per_s: float) -> None:
        """`done`: optimizer steps completed (1-based step number)."""
        if self.first_step is None:
            self.first_step = done - 1
        elapsed = time.perf_counter() - self.start
        rate = (done - self.first_step) / elapsed if elapsed > 0 else 0.0
        eta = (self.total - done) / rate if rate > 0 else 0.0
        loss_txt = f"{loss:.4f}" if loss is not None else "skipped"
        text = f"step {done}/{self.total} loss {loss_txt} tok/s {tokens_per_s:,.0f} eta {eta:4.0f}s"
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


@dataclass
class RunTotals:
    steps: int = 0
    tokens: int = 0
    seconds: float = 0.0
    final_loss: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class Tracker:
    """Writes one JSON line per optimizer step and the summary; draws progress. Rank 0 only."""

    def __init__(self, run_dir: Path, total_steps: int, log_every: int, enabled: bool) -> None:
        self.run_dir = run_dir
        self.enabled = enabled
        self.totals = RunTotals()
        self.progress = Progress(total_steps, log_every) if enabled else None
        self._metrics: TextIO | None = None
        if enabled:
            # Appended, never rewritten: a resumed run continues the same file.
            self._metrics = open(run_dir / METRICS_FILE, "a", encoding="utf-8")  # noqa: SIM115

    def log_step(self, metrics: dict[str, Any]) -> None:
        self.totals.steps += 1
        self.totals.tokens += int(metrics.get("tokens", 0))
        self.totals.seconds += float(metrics.get("step_time_s", 0.0))
        if metrics.get("loss") is not None:
            self.totals.final_loss = metrics["loss"]
        if not self.enabled:
            return
        assert self._metrics is not None and self.progress is not None
        clean = {k: (_finite(v) if isinstance(v, float) else v) for k, v in metrics.items()}
        self._metrics.write(json.dumps(clean) + "\n")
        self._metrics.flush()
        self.progress.update(int(metrics["step"]), clean.get("loss"), float(metrics.get("tokens_per_s", 0.0)))

    def finish(self, summary: dict[str, Any]) -> dict[str, Any]:
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None
        if not self.enabled:
            return summary
        path = self.run_dir / SUMMARY_FILE
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
        tmp.replace(path)
        return summary
