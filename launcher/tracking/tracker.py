"""What a run reports: metrics.jsonl, summary.json, console progress, wandb and the other
trackers of tracking.backends (rank 0 only).

The records themselves are typed: StepMetrics and RunTotals (tracking/metrics.py), RunSummary
(tracking/summary.py); Progress draws the console (tracking/progress.py).
"""

from __future__ import annotations

import json
import resource
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import torch

from launcher.events import read_events
from launcher.logs import get_logger
from launcher.rundir import METRICS_FILE, SUMMARY_FILE
from launcher.tracking.flops import (
    MfuMeter,
    device_name,
    hardware_utilisation,
    model_flops_per_token,
    resolve_peak,
)
from launcher.tracking.metrics import METRIC_KEYS, RunTotals, StepMetrics
from launcher.tracking.progress import Progress
from launcher.tracking.summary import RunShape, RunSummary
from launcher.userpath import open_own, replace_own

if TYPE_CHECKING:
    from launcher.config.root import RootConfig
    from launcher.distributed import DistContext
    from launcher.memory.peak import PeakMeter
    from launcher.tracking.sinks import Sink
    from launcher.tracking.wandb_run import WandbRun

__all__ = ["METRIC_KEYS", "Progress", "RunTotals", "StepMetrics", "Tracker", "start_tracking"]

log = get_logger("tracking")


def peak_rss_bytes() -> int:
    """Peak resident set size of this process (Linux reports KiB)."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def peak_memory_bytes(device: torch.device, meter: PeakMeter | None = None) -> int | None:
    """Peak tensor memory: torch.cuda.max_memory_allocated on GPU; on CPU the first steps'
    measured tensor peak (launcher/memory/peak.py), None before it is measured."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return meter.peak_bytes if meter is not None else None


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
        sinks: list[Sink] | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.enabled = enabled
        self.positions_per_step = positions_per_step
        self.meter = meter
        self.device = device or torch.device("cpu")
        self.recompute = recompute
        self.wandb = wandb if enabled else None
        self.sinks: list[Sink] = list(sinks or []) if enabled else []
        """The other trackers (tracking.backends: tensorboard, mlflow), fed as wandb is."""
        self.totals = RunTotals()
        self.progress = Progress(total_steps, log_every, stream) if enabled else None
        self._metrics: TextIO | None = None
        self.peak_meter: PeakMeter | None = None
        """The first steps' measured tensor peak (set by the worker)."""
        self.compile_clock: Callable[[], float] | None = None
        """Seconds compiled so far, with train.compile (set by the worker)."""
        self.compile_s: float | None = None
        """Seconds compiled by the first step that compiled, inside that step (shown on its
        progress line; the loop's StepClock reads compile_clock around each step)."""
        if enabled:
            # Appended: a resumed run continues the same file (after `rewind`).
            metrics = open_own(run_dir / METRICS_FILE)  # never through a link
            self._metrics = open(metrics, "a", encoding="utf-8")  # noqa: SIM115

    def rewind(self, step: int) -> None:
        """A resume from the checkpoint of `step`: drop the lines of later steps (redone after a
        crash, or an abandoned branch when resuming an older checkpoint) and any line cut short,
        so that metrics.jsonl holds each step once. Rank 0 only; rewritten atomically."""
        if not self.enabled:
            return
        self._close_metrics()
        path = self.run_dir / METRICS_FILE
        kept: list[str] = []
        if path.exists():
            for line in path.read_text(encoding="utf-8").splitlines():
                try:
                    if int(json.loads(line)["step"]) <= step:
                        kept.append(line + "\n")
                except (ValueError, KeyError, TypeError):
                    continue  # a line cut short by the crash
        replace_own(path, "".join(kept))
        self._metrics = open(open_own(path), "a", encoding="utf-8")  # noqa: SIM115

    def _mfu(self, positions: int, seconds: float) -> float | None:
        return self.meter.mfu(positions, seconds) if self.meter is not None else None

    def log_step(self, m: StepMetrics) -> None:
        self.totals.add(m, self.positions_per_step)
        compiled = None  # on the line of the first step that compiled (paid it), once
        if self.compile_s is None and m.compile_s > 0:
            self.compile_s = compiled = m.compile_s
        if not self.enabled:
            return
        assert self._metrics is not None and self.progress is not None
        line = m.line(
            self._mfu(self.positions_per_step, m.step_time_s),
            peak_memory_bytes(self.device, self.peak_meter),
            peak_rss_bytes(),
        )
        self._metrics.write(json.dumps(line) + "\n")
        self._metrics.flush()
        if self.wandb is not None:
            self.wandb.log(line)
        for sink in self.sinks:
            sink.log(line)
        self.progress.update(
            m.step,
            line["loss"],
            line["tokens_per_s"] or 0.0,
            line["mfu"],
            line["peak_memory_bytes"],
            compiled,
        )

    def summary(
        self,
        shape: RunShape,
        *,
        peak_memory: int | None,
        eval_accuracy: float | None,
        resumed_from_step: int | None,
        activations: dict[str, Any],
        planned_peak: int | None = None,
    ) -> RunSummary:
        """The run's summary from its totals, utilisation and the caller's measurements."""
        t = self.totals
        mfu = self._mfu(t.positions, t.seconds)
        ratio = activations.get("recompute_flops_ratio")
        return RunSummary(
            steps=t.steps,
            final_loss=t.final_loss,
            tokens=t.tokens,
            tokens_per_s=t.tokens_per_s,
            train_seconds=t.seconds,
            peak_memory_bytes=peak_memory,
            planned_peak_bytes=planned_peak,
            peak_rss_bytes=peak_rss_bytes(),
            shape=shape,
            eval_accuracy=eval_accuracy,
            resumed_from_step=resumed_from_step,
            activations=activations,
            mfu=mfu,
            hfu=hardware_utilisation(mfu, self.recompute, ratio),
            flops_per_token=self.meter.flops_per_token if self.meter is not None else None,
            peak_flops=self.meter.peak_per_device if self.meter is not None else None,
            device=device_name(self.device),
            compute_s=t.compute_s,
            comm_wait_s=t.comm_wait_s,
            data_s=t.data_s,
            padding_fraction=t.padding_fraction,
            rank_tokens_min=t.rank_tokens_min,
            rank_tokens_max=t.rank_tokens_max,
            wandb_run_id=self.wandb.id if self.wandb is not None else None,
            compile_s=self.compile_clock() if self.compile_clock is not None else None,
            events=tuple(read_events(self.run_dir)),
        )

    def finish(self, summary: RunSummary) -> dict[str, Any]:
        """Write summary.json (rank 0) and finish wandb; the JSON written."""
        values = summary.to_json()
        self._close_metrics()
        if not self.enabled:
            return values
        path = self.run_dir / SUMMARY_FILE
        replace_own(path, json.dumps(values, indent=2) + "\n")
        if self.wandb is not None:
            self.wandb.finish(values)
            self.wandb = None
        self._finish_sinks(values, 0)
        return values

    def close(self, exit_code: int) -> None:
        """After a failure or a stop: flush metrics and end the wandb run with this exit code."""
        self._close_metrics()
        if self.wandb is not None:
            self.wandb.finish(None, exit_code)
            self.wandb = None
        self._finish_sinks(None, exit_code)

    def _finish_sinks(self, summary: dict[str, Any] | None, exit_code: int) -> None:
        sinks, self.sinks = self.sinks, []
        for sink in sinks:
            sink.finish(summary, exit_code)

    def _close_metrics(self) -> None:
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None


def start_tracking(
    cfg: RootConfig, run_dir: Path, ctx: DistContext, stream: TextIO | None = None
) -> Tracker:
    """The Tracker of one rank: MFU against the device's peak, wandb and the other trackers
    (tracking.backends) started on rank 0."""
    from launcher.tracking.sinks import start_sinks
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
    sinks = []
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
        sinks = start_sinks(cfg, run_dir, derived)
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
        sinks=sinks,
    )
