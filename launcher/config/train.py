"""Optimizer, training loop and model-checkpoint settings."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from launcher.config.checks import require_finite, require_non_negative, require_positive
from launcher.errors import ConfigError

if TYPE_CHECKING:
    from launcher.config.parallel import ParallelConfig

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?)(B?)\s*$", re.IGNORECASE)
_POWERS = {"": 0, "K": 1, "M": 2, "G": 3, "T": 4}


def parse_size(key: str, value: str | int) -> int:
    """Bytes from 123456, "512MiB", "40GiB", "1.5GB" (GB = 10**9, GiB = 2**30; "40G" = GiB)."""
    match = _SIZE.match(str(value))
    if match is None or (match.group(2) == "" and match.group(3)):
        raise ConfigError(
            key,
            f"{value!r} is not a size.",
            f"give bytes or a size with a unit, e.g. {key}=40GiB, 512MiB or 1.5GB.",
        )
    number, unit, binary, b = match.groups()
    power = _POWERS[unit.upper()]
    base = 1000 if (b and not binary and unit) else 1024
    size = int(float(number) * base**power)
    if size <= 0:
        raise ConfigError(key, f"must be positive, got {value!r}.", f"e.g. {key}=40GiB.")
    return size


ELASTIC_RESTARTS = 3
"""An elastic job's restarts when train.max_restarts is null: TorchElastic's customary
`--max-restarts=3`, enough for a lost node and a crash or two besides."""


def elastic_restarts(parallel: ParallelConfig) -> int:
    """train.max_restarts=null on an elastic job: ELASTIC_RESTARTS, or one per node it may lose
    (parallel.nodes - parallel.min_nodes) when that is more, since each lost node costs one."""
    return max(ELASTIC_RESTARTS, parallel.nodes - parallel.least_nodes)


class Precision(str, Enum):
    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"


@dataclass
class OptimConfig:
    """AdamW with linear warmup then cosine decay, counted in optimizer steps."""

    lr: float = 3e-3
    """Peak learning rate."""
    min_lr_ratio: float = 0.1
    """Final learning rate as a fraction of lr."""
    warmup_steps: int = 20
    """Optimizer steps of linear warmup."""
    weight_decay: float = 0.01
    """AdamW weight decay (decoupled from the gradient)."""
    beta1: float = 0.9
    """AdamW first-moment decay."""
    beta2: float = 0.98
    """AdamW second-moment decay."""
    eps: float = 1e-8
    """AdamW denominator epsilon."""
    grad_clip: float = 1.0
    """Max global gradient norm (0 disables clipping; the norm is still logged)."""

    def __post_init__(self) -> None:
        require_finite("optim", self)
        require_positive("optim.lr", self.lr)
        require_non_negative("optim.warmup_steps", self.warmup_steps)
        require_non_negative("optim.weight_decay", self.weight_decay)
        require_non_negative("optim.grad_clip", self.grad_clip)
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ConfigError("optim.min_lr_ratio", f"must be in [0, 1], got {self.min_lr_ratio}.")
        for key in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, key) < 1.0:
                raise ConfigError(f"optim.{key}", "must be in [0, 1).")


@dataclass
class TrainConfig:
    """The training loop."""

    steps: int = 1500
    """Optimizer steps to run."""
    seed: int = 0
    """Seeds model init, data order and dropout; data order depends on nothing else."""
    precision: Precision = Precision.fp32
    """fp32 | bf16 | fp16 (fp16 uses loss scaling)."""
    device: str = "auto"
    """auto (CUDA when present, else CPU) | cpu | cuda."""
    resume: str = "auto"
    """auto: newest complete checkpoint in the run dir; never: start fresh; or a checkpoint path."""
    log_every: int = 10
    """Plain log line every N steps when output is not a terminal."""
    max_restarts: int | None = None
    """torchrun restarts after a rank dies (resume from the newest checkpoint); a SLURM elastic
    job's relaunches after a lost node count against them too. null: 0, or for an elastic job
    (parallel.min_nodes < parallel.nodes) ELASTIC_RESTARTS, or one per node it may lose when
    that is more (`elastic_restarts`)."""
    hang_timeout: float = 900.0
    """Seconds a rank may go without finishing an optimizer step before the job is declared hung:
    the rank is named with its stack, every rank's stacks go to hang_report.txt, and the job ends
    with exit status HUNG (or restarts, train.max_restarts). Not counted: start-up and the first
    step (compilation), checkpoint saves, the end. 0 disables the watchdog."""
    peak_flops: float | None = None
    """Device peak FLOP/s for MFU; null looks the device up in a table."""
    compile: bool = False
    """torch.compile each of the model's repeated blocks in place (recompute and FSDP keep
    working, checkpoints stay interchangeable with eager runs); the first compiled step pays the
    compilation, reported as compile_s (docs/engines.md#compiling-the-blocks-traincompile)."""
    memory_budget: str | None = None
    """Per-rank memory the plan must fit: bytes or a size such as 40GiB (null: the GPU's
    memory on CUDA; on CPU the machine's RAM shared by its ranks)."""

    def __post_init__(self) -> None:
        require_finite("train", self)
        require_positive("train.steps", self.steps)
        require_positive("train.log_every", self.log_every)
        if self.max_restarts is not None:
            require_non_negative("train.max_restarts", self.max_restarts)
        require_non_negative("train.hang_timeout", self.hang_timeout)
        require_positive("train.peak_flops", self.peak_flops, allow_none=True)
        if self.device not in ("auto", "cpu", "cuda"):
            raise ConfigError(
                "train.device", f"unknown device {self.device!r}.", "use auto, cpu or cuda."
            )
        if not self.resume:
            raise ConfigError("train.resume", "is empty.", "use auto, never or a checkpoint path.")
        if self.memory_budget is not None:
            parse_size("train.memory_budget", self.memory_budget)

    @property
    def process_group_timeout_s(self) -> float:
        """The process group's own timeout: twice train.hang_timeout (at least 10 minutes), so the
        watchdog names a hung rank before a collective times out."""
        return max(600.0, 2 * self.hang_timeout)

    @property
    def memory_budget_bytes(self) -> int | None:
        """train.memory_budget in bytes; None when not given."""
        if self.memory_budget is None:
            return None
        return parse_size("train.memory_budget", self.memory_budget)


@dataclass
class CheckpointConfig:
    """Training-state checkpoints under <run dir>/checkpoints/."""

    every: int = 0
    """Save every N optimizer steps (0: only at the end)."""
    keep: int = 2
    """Complete checkpoints to keep (older ones are deleted)."""
    enabled: bool = True
    """Save at all (the final checkpoint included)."""
    overwrite: bool = False
    """With train.resume=never: delete the run directory's checkpoints and metrics and start
    over (without it such a run is refused)."""
    allow_data_change: bool = False
    """Resume although a data source (data.path, data.val_path, the tokenizer's files) changed
    since the checkpoint was saved (without it such a resume is refused)."""
    async_: bool = False
    """Training goes on while a checkpoint is written (a copy of the state is
    taken first; the next save waits for the previous one). ddp and fsdp only."""

    def __post_init__(self) -> None:
        require_non_negative("checkpoint.every", self.every)
        require_positive("checkpoint.keep", self.keep)


@dataclass
class DebugConfig:
    """Test-only switches. Never set these for real training."""

    broken_normalization: bool = False
    """Negative control: average per-micro-batch means (the known wrong loss)."""
    broken_tp_count: bool = False
    """Negative control under parallel.tp > 1: count valid tokens per world rank, not per
    data-parallel rank (each token counted tp times)."""
    raise_at_step: int | None = None
    """Make rank `raise_on_rank` raise at this 1-based step (to test failure handling)."""
    raise_on_rank: int = 0
    """The rank that raises at debug.raise_at_step."""
    step_sleep_s: float = 0.0
    """Sleep after every optimizer step, so a test can signal or kill a run mid-way."""
    pause_save_at_step: int | None = None
    """Hold the save of this step before its completion record is written (rank 0 leaves
    save_paused.json in the run directory and waits forever), so a test can kill the run there."""
    stop_at_end_on_rank: int | None = None
    """This rank stops itself (SIGSTOP) once training and the final checkpoint are over, as a rank
    wedged at the end of a run (evaluation, tracker, teardown) would hold the job."""

    def __post_init__(self) -> None:
        require_finite("debug", self)
        require_non_negative("debug.step_sleep_s", self.step_sleep_s)
        require_positive("debug.pause_save_at_step", self.pause_save_at_step, allow_none=True)
        if self.stop_at_end_on_rank is not None:
            require_non_negative("debug.stop_at_end_on_rank", self.stop_at_end_on_rank)
