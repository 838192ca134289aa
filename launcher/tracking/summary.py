"""How a rank's run ended: summary.json of a completed run, or a graceful stop; each knows the
exit status the process returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from launcher.exit_codes import OK, STOPPED_RESUMABLE
from launcher.tracking.metrics import clean

ACTIVATION_KEYS = (
    "activation_cuda_peak_bytes",
    "activation_bytes",
    "activation_peak_bytes",
    "recompute_flops_ratio",
)
"""What recompute.measure.activation_report measures (rank 0 only; the first on GPUs only)."""


@dataclass(frozen=True)
class RunShape:
    """What ran: world, split, engine and activation-checkpoint policy."""

    world_size: int
    dp: int
    micro_size: int
    grad_accum: int
    global_size: int
    engine: str
    ac: str
    tp: int = 1
    """Ranks of one tensor-parallel group (world = dp x tp x pp)."""
    pp: int = 1
    """Pipeline stages' ranks (parallel.pp)."""


@dataclass(frozen=True)
class RunSummary:
    """summary.json of a completed run (keys and their order as written)."""

    steps: int
    final_loss: float | None
    tokens: int
    tokens_per_s: float
    train_seconds: float
    peak_memory_bytes: int | None
    """Peak tensor memory of a rank: CUDA's max_memory_allocated, or on CPU the tensor peak
    measured over the first steps (launcher/memory/peak.py)."""
    planned_peak_bytes: int | None
    """The memory plan's per-rank peak (plan.json), to compare with peak_memory_bytes."""
    peak_rss_bytes: int
    """Peak resident set size of the process."""
    shape: RunShape
    eval_accuracy: float | None
    resumed_from_step: int | None
    activations: dict[str, Any]
    """The measured activation figures (ACTIVATION_KEYS present; empty on ranks other than 0)."""
    mfu: float | None
    hfu: float | None
    flops_per_token: int | None
    peak_flops: float | None
    device: str
    compute_s: float
    comm_wait_s: float
    data_s: float
    padding_fraction: float | None
    rank_tokens_min: int | None
    rank_tokens_max: int | None
    wandb_run_id: str | None
    status: str = "completed"
    final_val_loss: float | None = None
    """The last validation loss measured (eval.every), or None."""
    compile_s: float | None = None
    """Seconds this process spent compiling (train.compile: the first compiled step's forward
    and backward, and any recompilation, e.g. for validation); None when not compiled."""
    mixture: dict[str, Any] | None = None
    """A data.sources mixture: per source name its asked weight, valid target tokens, realised
    fraction of the mixture's tokens and samples (launcher/data/mixture.py)."""
    events: tuple[dict[str, Any], ...] = ()
    """The run's hangs, restarts and elastic changes so far (events.jsonl: when, why, which
    ranks and nodes, the steps redone), so summary.json and wandb's summary hold them too."""
    pipeline: dict[str, Any] | None = None
    """parallel.pp > 1: the stages and, per pipeline rank, the saved activation bytes it held at
    its schedule's peak, measured and planned (launcher/worker/stage_report.py)."""

    @property
    def exit_status(self) -> int:
        return OK

    def to_json(self) -> dict[str, Any]:
        s = self.shape
        values: dict[str, Any] = {
            "steps": self.steps,
            "final_loss": self.final_loss,
            "final_val_loss": self.final_val_loss,
            "tokens": self.tokens,
            "tokens_per_s": self.tokens_per_s,
            "train_seconds": self.train_seconds,
            "compile_s": self.compile_s,
            "peak_memory_bytes": self.peak_memory_bytes,
            "planned_peak_bytes": self.planned_peak_bytes,
            "peak_rss_bytes": self.peak_rss_bytes,
            "world_size": s.world_size,
            "dp": s.dp,
            "tp": s.tp,
            "pp": s.pp,
            "micro_size": s.micro_size,
            "grad_accum": s.grad_accum,
            "global_size": s.global_size,
            "engine": s.engine,
            "ac": s.ac,
            "eval_accuracy": self.eval_accuracy,
            "status": self.status,
            "resumed_from_step": self.resumed_from_step,
            **{k: self.activations[k] for k in ACTIVATION_KEYS if k in self.activations},
            "mfu": self.mfu,
            "hfu": self.hfu,
            "flops_per_token": self.flops_per_token,
            "peak_flops": self.peak_flops,
            "device": self.device,
            "compute_s": self.compute_s,
            "comm_wait_s": self.comm_wait_s,
            "data_s": self.data_s,
            "padding_fraction": self.padding_fraction,
            "rank_tokens_min": self.rank_tokens_min,
            "rank_tokens_max": self.rank_tokens_max,
            "wandb_run_id": self.wandb_run_id,
        }
        values = clean(values)
        if self.mixture is not None:
            values["mixture"] = self.mixture
        if self.pipeline is not None:
            values["pipeline"] = self.pipeline
        if self.events:
            values["events"] = list(self.events)
        return values


@dataclass(frozen=True)
class StoppedRun:
    """A stop signal ended the run at a step boundary, after a checkpoint (no summary.json)."""

    steps: int | None = None
    checkpoint: str | None = None
    status: str = "stopped"

    @property
    def exit_status(self) -> int:
        return STOPPED_RESUMABLE


RunEnd = RunSummary | StoppedRun
