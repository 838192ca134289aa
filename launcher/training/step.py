"""The result of one optimizer step while its numbers may still be on the device."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from launcher.config.batch import BatchSplit
from launcher.errors import LauncherError
from launcher.exit_codes import DIVERGED
from launcher.tracking.metrics import StepMetrics
from launcher.training.loss import StepTokens
from launcher.training.steptime import StepTimes


@dataclass
class StepResult:
    """One optimizer step as the loop queued it.

    The token counts are on the host (the ranks agreed on them before the optimizer step); the
    summed loss and the gradient norm stay device tensors until `metrics()` reads them, which
    the loop does one step later. With several ranks the global loss sum arrives with the next
    step's counts (or from Trainer.flush); `global_loss_sum` is None until then.
    """

    step: int
    """0-based index of the global batch."""
    tokens: StepTokens
    lr: float
    times: StepTimes
    loss_sum: torch.Tensor | None = None
    """This rank's summed token loss (fp64, on the device); None when skipped or stopped."""
    grad_norm: torch.Tensor | None = None
    global_loss_sum: torch.Tensor | float | None = None
    """The summed token loss over all ranks, once known."""
    stopped: bool = False
    """The ranks agreed to stop before this step (a stop signal); nothing was trained."""
    val_loss: float | None = None
    """The validation loss measured after this step (eval.every), or None."""
    bubble: float | None = None
    """parallel.pp > 1: this rank's idle share of the step if it counts its pipeline's tokens
    (the last stage's), else 0.0; None without a pipeline."""
    global_bubble: float | None = None
    """The mean of `bubble` over the data-parallel streams, once known (as the loss sum)."""

    @property
    def skipped(self) -> bool:
        return self.loss_sum is None

    @property
    def loss(self) -> float | None:
        """The global token mean (host sync); None for a skipped step."""
        if self.loss_sum is None:
            return None
        if self.global_loss_sum is None:
            raise RuntimeError(
                f"step {self.step + 1}: the loss is still being reduced over the ranks; "
                "it arrives with the next step or Trainer.flush()."
            )
        return float(self.global_loss_sum) / self.tokens.total

    def metrics(self, split: BatchSplit | None = None) -> StepMetrics:
        """The host-side record the tracker writes (reads the loss and the norm)."""
        del split  # the step's figures do not depend on it
        t = self.tokens
        return StepMetrics(
            step=self.step + 1,
            loss=self.loss,
            tokens=t.total,
            rank_tokens_min=min(t.per_rank),
            rank_tokens_max=max(t.per_rank),
            padding_fraction=t.padding_fraction,
            lr=self.lr,
            grad_norm=None if self.grad_norm is None else float(self.grad_norm),
            step_time_s=self.times.total_s,
            data_s=self.times.data_s,
            comm_wait_s=self.times.comm_s,
            val_loss=self.val_loss,
            compile_s=self.times.compile_s,
            pp_bubble=self.global_bubble,
        )


class LossNotFinite(LauncherError):
    """The loss of a step is NaN or infinite. Raised when the step is logged, which is always
    before any checkpoint of a later state is saved (a save logs the step in flight first), so
    the newest checkpoint on disk is the last good one."""

    exit_code = DIVERGED

    def __init__(self, metrics: StepMetrics, run_dir: Path | None) -> None:
        from launcher.checkpoint.files import find_checkpoints

        found = find_checkpoints(run_dir, warn=False) if run_dir is not None else []
        last = (
            f"the last good checkpoint is step {found[0].step} ({found[0].path})"
            if found
            else "there is no checkpoint to go back to"
        )
        self.step = metrics.step
        super().__init__(
            f"step {metrics.step}: the loss is {metrics.loss} (learning rate {metrics.lr:.3g}, "
            f"gradient norm {metrics.grad_norm}); training stopped and nothing of this state was "
            f"saved: {last}. Fix: lower optim.lr (or lengthen optim.warmup_steps, keep "
            "optim.grad_clip > 0), check the data for broken samples, or train in fp32/bf16 "
            "rather than fp16; a changed optim.* cannot resume these checkpoints, so start over "
            "(a new hydra.run.dir, or train.resume=never checkpoint.overwrite=true)."
        )


def check_finite(metrics: StepMetrics, run_dir: Path | None) -> StepMetrics:
    """The step's metrics, or LossNotFinite when its loss is NaN or infinite (the same on every
    rank: the loss is the global mean, so every rank stops at the same step)."""
    if metrics.loss is not None and not math.isfinite(metrics.loss):
        raise LossNotFinite(metrics, run_dir)
    return metrics
