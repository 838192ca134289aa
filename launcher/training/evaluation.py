"""The validation loss: a token-exact mean over held-out sequences, measured on every rank.

The held-out set's first eval.batches x batch.global_size sequences (fewer if it is smaller), in
order, are dealt to the ranks (rank r takes sequences r, r + dp, ...) in micro-batches of
batch.micro_size. Each rank sums its token losses and counts its valid tokens; one all-reduce of
the pair, then one division: the same number as one process over the whole set, for any split.
Every rank runs the same number of forwards (a rank short of sequences runs a fully masked one),
so sharded engines can gather their parameters. The model is in eval mode under no_grad, and
the RNG is restored afterwards: training never sees that evaluation happened.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from launcher.config.root import RootConfig
from launcher.data.sequence import IGNORE_INDEX, Batch, Sample, TokenDataset, collate_batch
from launcher.distributed import DistContext
from launcher.engines.base import Engine
from launcher.logs import get_logger
from launcher.parallel.pipeline_schedule import PipelineRunner
from launcher.training.loss import token_loss_sum

log = get_logger("eval")


def eval_chunks(n: int, dp: int, micro: int, rank: int) -> list[list[int]]:
    """This rank's micro-batches of held-out indices; every rank gets the same number of them
    (an empty one where it has run out)."""
    mine = list(range(rank, n, dp))
    per_rank = -(-n // dp)  # ceil(n / dp)
    count = -(-per_rank // micro)
    return [mine[i * micro : (i + 1) * micro] for i in range(count)]


def due(step: int, every: int, last: int) -> bool:
    """Evaluate after step `step` (1-based): every `every` steps and after the last one."""
    return every > 0 and (step % every == 0 or step == last)


class Evaluator:
    """Called by the trainer after every optimizer step; measures on the due steps."""

    def __init__(
        self,
        cfg: RootConfig,
        ctx: DistContext,
        engine: Engine,
        val: TokenDataset,
        pipeline: PipelineRunner | None = None,
    ) -> None:
        split = cfg.split()
        self.ctx, self.engine, self.val = ctx, engine, val
        self.pipeline = pipeline
        """parallel.pp > 1: the forwards run through the pipeline's schedule."""
        self.micro, self.grad_accum = split.micro_size, split.grad_accum
        self.every, self.last = cfg.eval.every, cfg.train.steps
        n = min(len(val), cfg.eval.batches * split.global_size)
        self.chunks = eval_chunks(n, split.dp, split.micro_size, ctx.dp_rank)  # tp peers: alike

    def __call__(self, step: int) -> float | None:
        if not due(step, self.every, self.last):
            return None
        value = self.measure()
        if self.ctx.is_main:
            log.info(f"step {step}: val_loss {value if value is None else f'{value:.4f}'}")
        return value

    def _batch(self, indices: list[int], rows: int = 1) -> Batch:
        """The samples at `indices`, filled up to `rows` with fully masked ones (a rank that has
        run out: a forward that counts nothing; a pipeline's micro-batches: all of one size)."""
        samples = [self.val[i] for i in indices]
        if len(samples) < rows:
            first = self.val[0]
            masked = torch.full_like(first.targets, IGNORE_INDEX)
            samples += [Sample(first.input_ids, masked, first.position_ids)] * (rows - len(samples))
        return collate_batch(samples).to(self.ctx.device)

    def _through_pipeline(self, pipeline: PipelineRunner) -> torch.Tensor:
        """The held-out loss sum of this rank's chunks through the pipeline: micro-batches of
        micro_size rows, in groups of grad_accum (the schedule's micro-batches), the last group
        filled with fully masked micro-batches; 0 on ranks without the last stage."""
        batches = [self._batch(indices, self.micro) for indices in self.chunks]
        batches += [self._batch([], self.micro)] * (-len(batches) % self.grad_accum)
        total = torch.zeros((), dtype=torch.float64, device=self.ctx.device)
        for g in range(0, len(batches), self.grad_accum):
            group = batches[g : g + self.grad_accum]
            losses = pipeline.evaluate([b.inputs for b in group], [b.targets for b in group])
            if losses:
                total += torch.stack(losses).double().sum()
        return total

    @torch.no_grad()
    def measure(self) -> float | None:
        """The global token mean of the held-out loss (collective: every rank calls it)."""
        model, device = self.engine.model, self.ctx.device
        was_training = model.training
        cpu_rng = torch.get_rng_state()
        cuda_rng = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
        model.eval()
        totals = torch.zeros(2, dtype=torch.float64, device=device)
        try:
            if self.pipeline is not None:
                totals[0] += self._through_pipeline(self.pipeline)
            for indices in self.chunks:
                inputs, targets, positions = self._batch(indices)
                totals[1] += (targets != IGNORE_INDEX).sum()
                if self.pipeline is not None:
                    continue  # summed through the pipeline above
                with self.engine.autocast():
                    logits = model(inputs, **Batch(inputs, targets, positions).model_kwargs())
                logits = getattr(logits, "logits", logits)
                totals[0] += token_loss_sum(logits, targets).double()
            if dist.is_initialized() and dist.get_world_size() > 1:
                if not self.ctx.counts_tokens:  # a tp peer's or a pipeline's: counted once
                    totals.zero_()
                dist.all_reduce(totals)
        finally:
            model.train(was_training)
            torch.set_rng_state(cpu_rng)
            if cuda_rng is not None:
                torch.cuda.set_rng_state(cuda_rng, device)
        loss_sum, tokens = totals.tolist()
        return loss_sum / tokens if tokens > 0 else None


EvalHook = Callable[[int], float | None]
"""(optimizer steps done) -> the validation loss measured after that step, or None."""
