"""The training loop of one rank: accumulation with the token-exact loss, one step per global batch."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist

from launcher.config.root import RootConfig
from launcher.data.sampler import GlobalBatchSampler
from launcher.data.sequence import TokenDataset, collate
from launcher.distributed import DistContext
from launcher.engines.base import Engine
from launcher.logs import get_logger
from launcher.tracking.tracker import Tracker
from launcher.training.batch import BatchSplit
from launcher.training.loss import (
    StepTokens,
    all_reduce_token_counts,
    micro_loss,
    token_loss_sum,
    valid_tokens,
)
from launcher.training.steptime import StepClock, StepTimes
from launcher.worker.stop import StopFlag

log = get_logger("loop")


@dataclass
class StepResult:
    step: int
    loss: float | None
    tokens: StepTokens
    grad_norm: float | None
    lr: float
    seconds: float
    data_s: float = 0.0
    comm_wait_s: float = 0.0
    """Time building micro-batches, and blocked in the loop's own collectives (launcher/steptime.py)."""
    stopped: bool = False
    """The ranks agreed to stop before this step (a stop signal); nothing was trained."""

    def metrics(self, split: BatchSplit) -> dict[str, Any]:
        return {
            "step": self.step + 1,
            "loss": self.loss,
            "tokens": self.tokens.total,
            "lr": self.lr,
            "grad_norm": self.grad_norm,
            "tokens_per_s": self.tokens.total / self.seconds if self.seconds > 0 else 0.0,
            "step_time_s": self.seconds,
            "compute_s": max(0.0, self.seconds - self.data_s - self.comm_wait_s),
            "comm_wait_s": self.comm_wait_s,
            "data_s": self.data_s,
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
        self.cfg, self.ctx, self.engine, self.dataset, self.tracker = (
            cfg,
            ctx,
            engine,
            dataset,
            tracker,
        )
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

    def train_step(self, step: int, stop: bool = False) -> StepResult:
        """One optimizer step over this rank's micro-batches of global batch `step`.

        stop: this rank was asked to stop; the token-count all-reduce tells every rank whether
        any was, and then none trains this step (the result has stopped=True).
        """
        device = self.ctx.device
        clock = StepClock(device)
        debug = self.cfg.debug
        if debug.raise_at_step == step + 1 and debug.raise_on_rank == self.ctx.rank:
            raise RuntimeError(
                f"debug.raise_at_step={step + 1}: rank {self.ctx.rank} raises on purpose"
            )
        with clock.section("data"):
            batches = self._micro_batches(step)
            # Counted once, on the CPU copies: no device sync per micro-batch in the loop below.
            micro_valid = [valid_tokens(t) for _, t in batches]
        with clock.section("comm"):
            tokens = all_reduce_token_counts(sum(micro_valid), self.positions, device, stop)
        lr = self.engine.lr
        if tokens.stop:
            return replace(self._result(step, None, tokens, None, lr, clock.stop()), stopped=True)
        if tokens.total == 0:
            # Every rank sees the same total, so every rank skips together: no hang, no NaN.
            log.warning(f"step {step + 1}: the global batch has no valid target token; skipped.")
            return self._result(step, None, tokens, None, lr, clock.stop())
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
                        micro_valid=micro_valid[m],
                        grad_accum=self.split.grad_accum,
                        broken_normalization=broken,
                    )
                )
            loss_sum += micro_sum.detach().double()
        grad_norm = self.engine.step()
        if dist.is_initialized() and self.ctx.world_size > 1:
            with clock.section("comm"):
                dist.all_reduce(loss_sum)  # for the logged global token mean only
        loss = float(loss_sum) / tokens.total
        return self._result(step, loss, tokens, grad_norm, lr, clock.stop())

    @staticmethod
    def _result(
        step: int,
        loss: float | None,
        tokens: StepTokens,
        grad_norm: float | None,
        lr: float,
        t: StepTimes,
    ) -> StepResult:
        return StepResult(step, loss, tokens, grad_norm, lr, t.total_s, t.data_s, t.comm_s)

    def train(
        self, stop: StopFlag | None = None, after_step: Callable[[int], None] | None = None
    ) -> bool:
        """Train up to train.steps; False when the ranks agreed to stop early (a stop signal).

        after_step(n) runs on every rank after step n (1-based) is logged: periodic checkpoints.
        """
        while self.step < self.cfg.train.steps:
            result = self.train_step(self.step, stop=stop is not None and stop.requested)
            if result.stopped:
                return False
            self.step += 1
            self.tracker.log_step(result.metrics(self.split))
            if after_step is not None:
                after_step(self.step)
            if self.cfg.debug.step_sleep_s:
                time.sleep(self.cfg.debug.step_sleep_s)  # test-only: time to signal a run mid-way
        return True
