"""The training loop of one rank: accumulation with the token-exact loss, one step per global batch.

The step does not block on the device. Host waits that remain, per step:

1. the counts all-reduce (`StepCounts.read`), once the step's forward and backward are queued and
   before its optimizer step: every rank must make the same two decisions on the host, stop (a
   signal reached some rank) and skip (the global batch has no valid token), and the optimizer
   step cannot be queued before them. On a GPU this waits for the previous step's optimizer
   step and the all-reduce only; this step's forward and backward are still queued behind them.
   With gloo (CPUs) collectives run on the host: the all-reduce is started before the first
   forward and waited for after it, where the loss scale is first needed.
2. metrics of step k are read (`float` of the loss and gradient norm) after step k+1 reached
   wait 1, so they are complete by then and cost no extra wait.
3. a GradScaler (fp16 only) and DeepSpeed's step read overflow flags on the host themselves.

The token count that scales the loss stays on the device; the summed loss of step k rides on
step k+1's counts all-reduce (one small collective per step), and `flush` reduces the last one
on its own (at the end and before a checkpoint, so metrics.jsonl is complete up to it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from launcher.config.root import RootConfig
from launcher.data.mixture import MixtureDataset
from launcher.data.sampler import sampler_for
from launcher.data.sequence import IGNORE_INDEX, TokenDataset, collate_batch
from launcher.distributed import DistContext
from launcher.engines.base import Engine
from launcher.logs import get_logger
from launcher.parallel.pipeline_schedule import PipelineRunner
from launcher.tracking.metrics import RunTotals
from launcher.tracking.tracker import Tracker
from launcher.training.evaluation import EvalHook
from launcher.training.hooks import StepCallback, StopRequest
from launcher.training.loss import (
    DataRanks,
    LossFn,
    MicroLossContext,
    StepCounts,
    reduce_loss_sum,
    token_exact_loss,
    token_loss_sum,
    valid_tokens,
)
from launcher.training.prefetch import Batch, Prefetcher
from launcher.training.step import StepResult, check_finite
from launcher.training.steptime import StepClock

log = get_logger("loop")


def _rng_state(device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda


def _set_rng_state(state: tuple[torch.Tensor, torch.Tensor | None], device: torch.device) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


def data_ranks(ctx: DistContext, broken_tp_count: bool = False) -> DataRanks:
    """The step counts' layout: one slot per data-parallel rank, filled by one rank of each
    tensor-parallel group. broken_tp_count: the negative control, every world rank counts."""
    if broken_tp_count:
        return DataRanks(ctx.rank, ctx.world_size)
    return DataRanks(ctx.dp_rank, ctx.dp_size, ctx.counts_tokens)


class Trainer:
    """One rank's training: `train` runs to train.steps; `train_step` is one optimizer step.

    callbacks: run around every step (periodic checkpoints, the tests' fault injection).
    loss_fn: what each micro-batch backpropagates; the token-exact loss unless a test installs
    the negative control.
    """

    def __init__(
        self,
        cfg: RootConfig,
        ctx: DistContext,
        engine: Engine,
        dataset: TokenDataset,
        tracker: Tracker,
        *,
        callbacks: Sequence[StepCallback] = (),
        loss_fn: LossFn = token_exact_loss,
    ) -> None:
        self.cfg, self.ctx, self.engine, self.dataset = cfg, ctx, engine, dataset
        self.tracker = tracker
        self.callbacks = list(callbacks)
        self.loss_fn = loss_fn
        self.split = cfg.split()
        self.ranks = data_ranks(ctx, cfg.debug.broken_tp_count)
        """This rank's slot in the step's counts: its data-parallel index (tp peers share it)."""
        self.sampler = sampler_for(
            dataset, self.split.global_size, cfg.train.seed, cfg.data.order.value
        )
        self.mixture = dataset if isinstance(dataset, MixtureDataset) else None
        """A data.sources mixture: its valid tokens per source are counted with each step's."""
        self.positions = self.split.global_size * cfg.model.seq_len
        self.step = 0  # optimizer steps done (the next step's index)
        self.pending: StepResult | None = None
        """The last step, not logged yet: its numbers are read once the next step is queued."""
        self.batches = Prefetcher(self._micro_batches, pin=ctx.device.type == "cuda")
        # The loop's own collectives, attributes so that a test can count them on this trainer:
        # the step's counts all-reduce, and the loss of a step with no next step to ride on.
        self.counts: Any = StepCounts
        self.reduce_loss: Any = reduce_loss_sum
        self.evaluate: EvalHook | None = None
        """The validation loss after a step (training/evaluation.py), before the callbacks."""
        self.pipeline = (
            PipelineRunner(
                engine.model, ctx, cfg.parallel.pp_schedule, self.split.grad_accum, self.stage_loss
            )
            if ctx.pp > 1
            else None
        )
        """parallel.pp > 1: this rank's stages; a step's micro-batches run through the schedule."""

    def stage_loss(
        self,
        logits: torch.Tensor,
        targets: torch.Tensor,
        scale: torch.Tensor,
        evaluating: bool = False,
    ) -> torch.Tensor:
        """What the pipeline's last stage backpropagates for one micro-batch: the same loss
        function as without a pipeline, inside the schedule (evaluating: the summed token loss
        of a held-out micro-batch, nothing backpropagated)."""
        if evaluating:
            return token_loss_sum(logits, targets)
        # a host sync, so counted only for a loss that reads it (the negative control)
        valid = 0 if self.loss_fn is token_exact_loss else valid_tokens(targets)
        context = MicroLossContext(scale, valid, self.split.grad_accum)
        return self.loss_fn(token_loss_sum(logits, targets), context)

    def continue_from(self, step: int, totals: RunTotals) -> None:
        """Continue a resumed run: `step` steps done, the run's totals so far."""
        self.step, self.pending = step, None
        self.tracker.totals = totals

    def _micro_batches(self, step: int) -> tuple[list[Batch], tuple[int, ...]]:
        """This rank's micro-batches of step `step`, and (a mixture) their valid tokens per
        source."""
        indices = self.sampler.micro_batches(step, self.split, self.ctx.dp_rank)
        batches = [collate_batch([self.dataset[i] for i in chunk]) for chunk in indices]
        if self.mixture is None:
            return batches, ()
        per_source = np.zeros(len(self.mixture.names), dtype=np.int64)
        for chunk, batch in zip(indices, batches, strict=True):
            valid = (batch.targets != IGNORE_INDEX).sum(dim=1).numpy()
            np.add.at(per_source, self.mixture.source_of(chunk), valid)
        return batches, tuple(int(v) for v in per_source)

    def probe_batch(self) -> Batch:
        """This rank's first micro-batch of step 0 (for activation measurements)."""
        return self.batches.build(0).batches[0].to(self.ctx.device)

    def train_step(
        self, step: int, stop: bool = False, carry: StepResult | None = None
    ) -> StepResult:
        """Queue one optimizer step over this rank's micro-batches of global batch `step`.

        stop: this rank was asked to stop; the counts all-reduce tells every rank whether any
        was, and then none trains this step (the result has stopped=True).
        carry: the previous step, whose summed loss rides on this step's all-reduce; its
        global_loss_sum is set here.
        """
        device, engine = self.ctx.device, self.engine
        clock = StepClock(self.tracker.compile_clock)
        with clock.section("data"):
            work = self.batches.get(step, prefetch_next=step + 1 < self.cfg.train.steps)
            batches = [b.to(device, non_blocking=True) for b in work.batches]
        carried = carry.loss_sum if carry is not None and carry.global_loss_sum is None else None
        carried_bubble = carry.bubble if carry is not None and carried is not None else None
        with clock.section("comm"):
            counts = self.counts(
                sum(work.valid), stop, carried, device, work.per_source, self.ranks, carried_bubble
            )
        lr, rng = engine.lr, _rng_state(device)
        loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        scale: torch.Tensor | float | None = None
        bubble: float | None = None
        if self.pipeline is not None:
            with clock.section("comm"):  # the counts come first: the last stage's scale
                stage_scale = torch.as_tensor(counts.scale(engine.grad_divisor), device=device)
            losses = self.pipeline.step(
                [b.inputs for b in batches], [b.targets for b in batches], stage_scale
            )
            if losses:  # the last stage: each is its micro-batch's token loss sum x scale
                loss_sum += torch.stack(losses).detach().double().sum() / stage_scale.double()
            # the last stage's idle share rides with the loss sum (its counting ranks add it)
            bubble = (self.pipeline.clock.share or 0.0) if self.ranks.counts else 0.0
            batches = []  # run by the schedule
        for m, batch in enumerate(batches):
            with engine.accumulation_context(sync=m == len(batches) - 1):
                with engine.autocast():
                    logits = engine.model(batch.inputs, **batch.model_kwargs())
                micro_sum = token_loss_sum(logits, batch.targets)
                if scale is None:  # the first forward ran while the counts were in flight
                    with clock.section("comm"):
                        scale = counts.scale(engine.grad_divisor)
                context = MicroLossContext(scale, work.valid[m], self.split.grad_accum)
                engine.backward(self.loss_fn(micro_sum, context))
            loss_sum += micro_sum.detach().double()
        with clock.section("comm"):
            tokens, global_sum = counts.read(self.positions)  # the host wait of the step
        if carried is not None and carry is not None:
            carry.global_loss_sum = global_sum
            if carried_bubble is not None:
                carry.global_bubble = counts.bubble_sum / self.ranks.size
        if tokens.stop or tokens.total == 0:
            # Every rank sees the same vector, so every rank decides alike: no hang, no NaN.
            # The gradients just computed are not applied (with no valid token they are zeros);
            # the RNG goes back to where a step that never ran would leave it.
            _set_rng_state(rng, device)
            if not tokens.stop:
                log.warning(
                    f"step {step + 1}: the global batch has no valid target token; skipped."
                )
            return StepResult(step, tokens, lr, clock.stop(), stopped=tokens.stop)
        grad_norm = engine.step()
        one_rank = self.ctx.world_size == 1
        result = StepResult(step, tokens, lr, clock.stop(), loss_sum, grad_norm, bubble=bubble)
        result.global_loss_sum = loss_sum if one_rank else None
        return result

    def advance(self, stop: bool = False) -> bool:
        """One step of `train`: run it, log the previous one; False when the ranks stopped."""
        for callback in self.callbacks:
            callback.before_step(self.step + 1)
        carry, self.pending = self.pending, None
        result = self.train_step(self.step, stop, carry)
        if carry is not None:
            self._log(carry)
        if result.stopped:
            return False
        self.step += 1
        self.pending = result
        if self.evaluate is not None:
            result.val_loss = self.evaluate(self.step)
        for callback in self.callbacks:
            callback.after_step(self.step)
        return True

    def flush(self) -> None:
        """Log the step still in flight. Collective: every rank calls it at the same point."""
        result, self.pending = self.pending, None
        if result is None:
            return
        if result.global_loss_sum is None and result.loss_sum is not None:
            if result.bubble is None:
                result.global_loss_sum = self.reduce_loss(result.loss_sum, self.ranks.counts)
            else:  # a pipeline's: the last stage's idle share in the same all-reduce
                bubble = torch.tensor(result.bubble, dtype=torch.float64, device=self.ctx.device)
                both = self.reduce_loss(torch.stack([result.loss_sum, bubble]), self.ranks.counts)
                result.global_loss_sum = both[0]
                result.global_bubble = float(both[1]) / self.ranks.size
        self._log(result)

    def _log(self, result: StepResult) -> None:
        """Record a finished step; a NaN or infinite loss stops the run here (LossNotFinite),
        before any checkpoint of a later state: every save flushes the step in flight first."""
        metrics = result.metrics()
        if self.mixture is not None and result.tokens.per_source:
            names = self.mixture.names
            metrics = replace(
                metrics, source_tokens=dict(zip(names, result.tokens.per_source, strict=True))
            )
        self.tracker.log_step(check_finite(metrics, self.tracker.run_dir))

    def train(self, stop: StopRequest | None = None) -> bool:
        """Train up to train.steps; False when the ranks agreed to stop early (a stop signal)."""
        try:
            while self.step < self.cfg.train.steps:
                if not self.advance(stop is not None and stop.requested):
                    return False
            self.flush()
            return True
        finally:
            self.batches.close()
