"""One optimizer step's micro-batches through the pipeline (torch.distributed.pipelining).

The schedule's micro-batches are the accumulation's (n_microbatches = batch.grad_accum), so the
batch arithmetic keeps its meaning. The last stage calls the loss function on each micro-batch
inside the schedule and backpropagates what it returns: the token-exact loss (its summed token
loss x grad_divisor / the step's global valid-token count, counted before the schedule runs).
`scale_grads=False`: the schedule would otherwise divide every gradient by n_microbatches after
the step (torchtitan #1733); nothing is rescaled after backward.

A trap of torch 2.13: the first step (and the first after an eval) calls the loss function once
more than there are micro-batches, for shape inference, outside the gradients; the loss is read
from the schedule's `losses` (one per micro-batch), never by counting calls.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Any

import torch
from torch import nn

from launcher.config.pipeline import GPIPE, INTERLEAVED, ONE_F_ONE_B
from launcher.distributed import DistContext
from launcher.parallel.mesh import PP
from launcher.parallel.pipeline_clock import BubbleClock
from launcher.parallel.pipeline_meter import SavedBytesMeter
from launcher.parallel.pipeline_split import RankStages

MEASURED_STEPS = 2
"""Steps whose saved activation bytes are measured (the later one is reported): the first step
also infers the stages' shapes; later steps run unmetered."""

StageLoss = Callable[..., torch.Tensor]
"""(logits, targets, scale, evaluating=False) of one micro-batch -> the quantity the last stage
backpropagates; with evaluating=True, its summed token loss (the validation loss's numerator)."""


class PipelineRunner:
    """This rank's stages in the job's pipeline and the schedule that drives them."""

    def __init__(
        self,
        module: nn.Module,
        ctx: DistContext,
        schedule: str,
        grad_accum: int,
        loss_fn: StageLoss,
    ) -> None:
        from torch.distributed.pipelining import (
            PipelineStage,
            Schedule1F1B,
            ScheduleGPipe,
            ScheduleInterleaved1F1B,
        )

        if not isinstance(module, RankStages):  # split_for_rank made it; never a user's module
            raise TypeError(f"a pipeline rank runs RankStages, got {type(module).__name__}")
        group = ctx.mesh.get_group(PP)
        self.stages: list[Any] = [  # PipelineStage; torch's schedules type their base class
            PipelineStage(part, part.index, module.n_stages, ctx.device, group=group)
            for part in module.stages
        ]
        self.meter = SavedBytesMeter(module)
        self.clock = BubbleClock(self.stages, cuda=ctx.device.type == "cuda")
        self.bubble_shares: list[float] = []
        """Each step's idle share of this rank after the first (which infers the stages'
        shapes): launcher/parallel/pipeline_clock.py."""
        loss_fn = self.clock.timed(loss_fn)
        self.saved_peak_bytes: int | None = None
        """The activation bytes this rank held for backward at once, over its last metered
        step (launcher/parallel/pipeline_meter.py); None before a step."""
        self._steps = 0
        self.first = any(stage.is_first for stage in self.stages)
        self.last = any(stage.is_last for stage in self.stages)
        if schedule == INTERLEAVED:
            self.schedule: Any = ScheduleInterleaved1F1B(
                self.stages, n_microbatches=grad_accum, loss_fn=loss_fn, scale_grads=False
            )
        else:
            single = {GPIPE: ScheduleGPipe, ONE_F_ONE_B: Schedule1F1B}[schedule]
            self.schedule = single(
                self.stages[0], n_microbatches=grad_accum, loss_fn=loss_fn, scale_grads=False
            )

    def step(
        self, inputs: Sequence[torch.Tensor], targets: Sequence[torch.Tensor], scale: torch.Tensor
    ) -> list[torch.Tensor]:
        """Forward and backward of the step's micro-batches (each `inputs[m]`, `targets[m]`) on
        this rank's stages; on the last stage's rank the loss function's value per micro-batch,
        else []."""
        losses: list[torch.Tensor] = []
        self._steps += 1
        metered = self._steps <= MEASURED_STEPS
        with self.meter if metered else nullcontext(), self.clock.step():
            self.schedule.step(
                *((torch.cat(list(inputs)),) if self.first else ()),
                target=torch.cat(list(targets)) if self.last else None,
                losses=losses if self.last else None,
                loss_kwargs={"scale": scale},
                return_outputs=False,  # the logits of every micro-batch are not kept for a merge
            )
        if metered:
            self.saved_peak_bytes = self.meter.peak_bytes
        if self._steps > 1 and self.clock.share is not None:
            self.bubble_shares.append(self.clock.share)
        return losses

    @property
    def bubble_measured(self) -> float | None:
        """This rank's mean idle share of a step (None before a second step)."""
        shares = self.bubble_shares
        return sum(shares) / len(shares) if shares else None

    @torch.no_grad()
    def evaluate(
        self, inputs: Sequence[torch.Tensor], targets: Sequence[torch.Tensor]
    ) -> list[torch.Tensor]:
        """Forward only (the schedule's eval) of one group of grad_accum held-out micro-batches;
        on the last stage's rank each one's summed token loss, else []. The next training step
        infers the stages' shapes again (torch's mode switch), outside the gradients."""
        losses: list[torch.Tensor] = []
        one = torch.ones((), device=inputs[0].device)
        self.schedule.eval(
            *((torch.cat(list(inputs)),) if self.first else ()),
            target=torch.cat(list(targets)) if self.last else None,
            losses=losses if self.last else None,
            loss_kwargs={"scale": one, "evaluating": True},
            return_outputs=False,
        )
        return losses
