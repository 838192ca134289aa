"""The result of one optimizer step while its numbers may still be on the device."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from launcher.tracking.metrics import StepMetrics
from launcher.training.batch import BatchSplit
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
        )
