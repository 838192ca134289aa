"""The training loop of one rank: accumulation with the token-exact loss, one step per global batch."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from launcher.batch import BatchSplit
from launcher.config.root import RootConfig
from launcher.data.sampler import GlobalBatchSampler
from launcher.data.sequence import TokenDataset, collate
from launcher.engines.base import Engine
from launcher.logs import get_logger
from launcher.loss import (
    StepTokens,
    all_reduce_token_counts,
    micro_loss,
    token_loss_sum,
    valid_tokens,
)
from launcher.tracking import Tracker
from launcher.worker.distributed import DistContext

log = get_logger("loop")


@dataclass
class StepResult:
    step: int
    loss: float | None
    tokens: StepTokens
    grad_norm: float | None
    lr: float
    seconds: float

    def metrics(self, split: BatchSplit) -> dict[str, Any]:
        return {
            "step": self.step + 1,
            "loss": self.loss,
            "tokens": self.tokens.total,
            "lr": self.lr,
            "grad_norm": self.grad_norm,
            "tokens_per_s": self.tokens.total / self.seconds if self.seconds > 0 else 0.0,
            "step_time_s": self.seconds,
            "rank_tokens_min": min(self.tokens.per_rank),
            "rank_tokens_max": max(self.tokens.per_rank),
            "padding_fraction": self.tokens.padding_fraction,
            "skipped": self.loss is None,
        }


class Trainer:
    def __init__(
        self,
        cfg: RootConfig,
        ctx: DistContext,
        engine: Engine,
        dataset: TokenDataset,
        tracker: Tracker,
    ) -> None:
        self.cfg, self.ctx, self.engine, self.dataset, self.tracker = cfg, ctx, engine, dataset, tracker
        self.split = cfg.split()
        self.sampler = GlobalBatchSampler(len(dataset), self.split.global_size, cfg.train.seed)
        self.positions = self.split.global_size * cfg.model.seq_len
        self.step = 0  # optimizer steps done (the next step's index)

    def _micro_batches(self, step: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        batches = self.sampler.micro_batches(step, self.split, self.ctx.rank)
        return [collate([self.dataset[i] for i in indices]) for indices in batches]

    def probe_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's first micro-batch of step 0 (for activation measurements)."""
        inputs, targets = self._micro_batches(0)[0]
        return inputs.to(self.ctx.device), targets.to(self.ctx.device)

    def train_step(self, step: int) -> StepResult:
        """One optimizer step over this rank's micro-batches of global batch `step`."""
        start = time.perf_counter()
        device = self.ctx.device
        batches = self._micro_batches(step)
        tokens = all_reduce_token_counts(
            sum(valid_tokens(t) for _, t in batches), self.positions, device
        )
        lr = self.engine.lr
        if tokens.total == 0:
            # Every rank sees the same total, so every rank skips together: no hang, no NaN.
            log.warning(f"step {step + 1}: the global batch has no valid target token; skipped.")
            return StepResult(step, None, tokens, None, lr, time.perf_counter() - start)
        loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        broken = self.cfg.debug.broken_normalization
        for m, (inputs, targets) in enumerate(batches):
            inputs, targets = inputs.to(device), targets.to(device)
            with self.engine.accumulation_context(sync=m == len(batches) - 1):
                with self.engine.autocast():
                    logits = self.engine.model(inputs)
                micro_sum = token_loss_sum(logits, targets)
                self.engine.backward(
                    micro_loss(
                        micro_sum,
                        tokens,
                        self.engine.grad_divisor,
                        micro_valid=valid_tokens(targets),
                        grad_accum=self.split.grad_accum,
                        broken_normalization=broken,
                    )
                )
            loss_sum += micro_sum.detach().double()
        grad_norm = self.engine.step()
        if dist.is_initialized() and self.ctx.world_size > 1:
            dist.all_reduce(loss_sum)  # for the logged global token mean only
        return StepResult(
            step, float(loss_sum) / tokens.total, tokens, grad_norm, lr, time.perf_counter() - start
        )

    def train(self) -> None:
        while self.step < self.cfg.train.steps:
            result = self.train_step(self.step)
            self.step += 1
            self.tracker.log_step(result.metrics(self.split))
