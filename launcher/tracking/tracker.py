"""What a run reports: metrics.jsonl, summary.json, console progress and wandb (rank 0 only)."""

from __future__ import annotations

import json
import math
import os
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import torch

from launcher.logs import get_logger
from launcher.rundir import METRICS_FILE, SUMMARY_FILE
from launcher.tracking.flops import (
    MfuMeter,
    device_name,
    hardware_utilisation,
    model_flops_per_token,
    resolve_peak,
)

if TYPE_CHECKING:
    from launcher.config.root import RootConfig
    from launcher.distributed import DistContext
    from launcher.tracking.wandb_run import WandbRun

log = get_logger("tracking")


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
    "skipped",
)
"""Every metrics.jsonl line carries these keys (null where not applicable); see the README."""


def peak_memory_bytes(device: torch.device) -> int:
    """torch.cuda.max_memory_allocated on GPU; peak resident set size of this process on CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def _clean(metrics: dict[str, Any]) -> dict[str, Any]:
    """JSON-safe: NaN and infinities become null."""
    return {k: (_finite(v) if isinstance(v, float) else v) for k, v in metrics.items()}


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


class Progress:
    """A one-line progress bar on a terminal; a plain line every `every` steps otherwise."""

    def __init__(self, total: int, every: int, stream: TextIO | None = None) -> None:
        self.total, self.every = total, every
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty() and os.environ.get("TERM") != "dumb"
        self.start = time.perf_counter()
        self.first_step: int | None = None

    def update(
        self,
        done: int,
        loss: float | None,
        tokens_per_s: float,
        mfu: float | None = None,
        memory: int | None = None,
    ) -> None:
        """`done`: optimizer steps completed (1-based step number)."""
        if self.first_step is None:
            self.first_step = done - 1
        elapsed = time.perf_counter() - self.start
        rate = (done - self.first_step) / elapsed if elapsed > 0 else 0.0
        eta = (self.total - done) / rate if rate > 0 else 0.0
        loss_txt = f"{loss:.4f}" if loss is not None else "skipped"
        text = f"step {done}/{self.total} loss {loss_txt} tok/s {tokens_per_s:,.0f}"
        if mfu is not None:
            text += f" mfu {mfu:.1%}"
        if memory is not None:
            text += f" mem {_gib(memory)}"
        text += f" eta {eta:.0f}s"
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

    def add(self, metrics: dict[str, Any], positions: int) -> None:
        self.steps += 1
        self.tokens += int(metrics.get("tokens", 0))
        self.positions += positions
        self.seconds += float(metrics.get("step_time_s", 0.0))
        self.data_s += float(metrics.get("data_s", 0.0))
        self.comm_wait_s += float(metrics.get("comm_wait_s", 0.0))
        if metrics.get("loss") is not None:
            self.final_loss = metrics["loss"]
        low, high = metrics.get("rank_tokens_min"), metrics.get("rank_tokens_max")
        if low is not None:
            self.rank_tokens_min = (
                low if self.rank_tokens_min is None else min(self.rank_tokens_min, low)
            )
        if high is not None:
            self.rank_tokens_max = (
                high if self.rank_tokens_max is None else max(self.rank_tokens_max, high)
            )


class Tracker:
    """Writes one JSON line per optimizer step and the summary; draws progress; feeds wandb.

    Only the enabled tracker (rank 0) writes; every rank keeps the totals.
    """

    def __init__(
        self,
        run_dir: Path,
        total_steps: int,
        log_every: int,
        enabled: bool,
        *,
        positions_per_step: int = 0,
        meter: MfuMeter | None = None,
        device: torch.device | None = None,
        recompute: bool = False,
        wandb: WandbRun | None = None,
        stream: TextIO | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.enabled = enabled
        self.positions_per_step = positions_per_step
        self.meter = meter
        self.device = device or torch.device("cpu")
        self.recompute = recompute
        self.wandb = wandb if enabled else None
        self.totals = RunTotals()
        self.progress = Progress(total_steps, log_every, stream) if enabled else None
        self._metrics: TextIO | None = None
        if enabled:
            # Appended, never rewritten: a resumed run continues the same file.
            self._metrics = open(run_dir / METRICS_FILE, "a", encoding="utf-8")  # noqa: SIM115

    def _mfu(self, positions: int, seconds: float) -> float | None:
        return self.meter.mfu(positions, seconds) if self.meter is not None else None

    def log_step(self, metrics: dict[str, Any]) -> None:
        self.totals.add(metrics, self.positions_per_step)
        if not self.enabled:
            return
        assert self._metrics is not None and self.progress is not None
        line: dict[str, Any] = dict.fromkeys(METRIC_KEYS)
        line.update(metrics)
        line["mfu"] = self._mfu(self.positions_per_step, float(metrics.get("step_time_s", 0.0)))
        line["peak_memory_bytes"] = peak_memory_bytes(self.device)
        clean = _clean(line)
        self._metrics.write(json.dumps(clean) + "\n")
        self._metrics.flush()
        if self.wandb is not None:
            self.wandb.log(clean)
        self.progress.update(
            int(clean["step"]),
            clean.get("loss"),
            float(clean.get("tokens_per_s") or 0.0),
            clean["mfu"],
            clean["peak_memory_bytes"],
        )

    def summary_fields(self, summary: dict[str, Any]) -> dict[str, Any]:
        """What the tracker adds to summary.json: utilisation, the time split, token extremes."""
        t = self.totals
        mfu = self._mfu(t.positions, t.seconds)
        return {
            "mfu": mfu,
            "hfu": hardware_utilisation(mfu, self.recompute, summary.get("recompute_flops_ratio")),
            "flops_per_token": self.meter.flops_per_token if self.meter is not None else None,
            "peak_flops": self.meter.peak_per_device if self.meter is not None else None,
            "device": device_name(self.device),
            "compute_s": max(0.0, t.seconds - t.data_s - t.comm_wait_s),
            "comm_wait_s": t.comm_wait_s,
            "data_s": t.data_s,
            "padding_fraction": 1.0 - t.tokens / t.positions if t.positions else None,
            "rank_tokens_min": t.rank_tokens_min,
            "rank_tokens_max": t.rank_tokens_max,
            "wandb_run_id": self.wandb.id if self.wandb is not None else None,
        }

    def finish(self, summary: dict[str, Any]) -> dict[str, Any]:
        """Write summary.json (the caller's fields win over the tracker's); finish wandb."""
        added = {k: v for k, v in self.summary_fields(summary).items() if k not in summary}
        summary = _clean({**summary, **added})
        self._close_metrics()
        if not self.enabled:
            return summary
        path = self.run_dir / SUMMARY_FILE
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
        tmp.replace(path)
        if self.wandb is not None:
            self.wandb.finish(summary)
            self.wandb = None
        return summary

    def close(self, exit_code: int) -> None:
        """After a failure or a stop: flush metrics and end the wandb run with this exit code."""
        self._close_metrics()
        if self.wandb is not None:
            self.wandb.finish(None, exit_code)
            self.wandb = None

    def _close_metrics(self) -> None:
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None


def start_tracking(
    cfg: RootConfig, run_dir: Path, ctx: DistContext, stream: TextIO | None = None
) -> Tracker:
    """The Tracker of one rank: MFU against the device's peak, wandb started on rank 0."""
    from launcher.tracking.wandb_run import WandbRun

    split = cfg.split()
    positions = split.global_size * cfg.model.seq_len
    peak = resolve_peak(cfg.train.peak_flops, ctx.device)
    if peak is None and ctx.device.type == "cuda" and ctx.is_main:
        log.warning(
            f"no peak FLOP/s known for {device_name(ctx.device)!r}, so MFU is not reported. "
            "Fix: set train.peak_flops (dense bf16 FLOP/s of one device)."
        )
    meter = MfuMeter(model_flops_per_token(cfg.model), peak, ctx.world_size)
    wandb = None
    if ctx.is_main:
        derived = {
            "world_size": ctx.world_size,
            "global_size": split.global_size,
            "micro_size": split.micro_size,
            "grad_accum": split.grad_accum,
            "tokens_per_step": positions,
            "flops_per_token": meter.flops_per_token,
            "peak_flops": peak,
            "device": device_name(ctx.device),
        }
        wandb = WandbRun.start(cfg, run_dir, derived)
    return Tracker(
        run_dir,
        cfg.train.steps,
        cfg.train.log_every,
        enabled=ctx.is_main,
        positions_per_step=positions,
        meter=meter,
        device=ctx.device,
        recompute=cfg.ac.policy.value != "none",
        wandb=wandb,
        stream=stream,
    )
