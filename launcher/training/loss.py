"""The token-exact loss: every optimizer step minimises the mean over all valid target tokens of
the whole global batch, whatever the split into ranks and micro-batches.

Per step, each rank counts the valid tokens of all its micro-batches; one all-reduce gives every
rank every rank's count (on the device: StepCounts). Each micro-batch then backpropagates

    sum of its token losses / global valid tokens * grad_divisor

where grad_divisor undoes the engine's own averaging (DDP divides gradients by the dp size).
Summed over micro-batches and ranks this is exactly the gradient of the global token mean.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from launcher.data.sequence import IGNORE_INDEX


def token_loss_sum(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Sum (not mean) of cross-entropy over targets != -100, in fp32.

    logits [batch, seq, vocab] with targets [batch, seq] (a language model), or logits
    [batch, classes] with targets [batch] (a classifier: one label per sample, so the valid
    "tokens" of the exact mean are the labelled samples)."""
    if logits.shape[:-1] != targets.shape:
        raise ValueError(
            f"logits {tuple(logits.shape)} do not match targets {tuple(targets.shape)}: expected "
            "logits [batch, seq, vocab] for targets [batch, seq], or [batch, classes] for [batch]"
        )
    return F.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]),
        targets.reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction="sum",
    )


def valid_tokens(targets: torch.Tensor) -> int:
    return int((targets != IGNORE_INDEX).sum())


@dataclass(frozen=True)
class StepTokens:
    """The step's valid-token counts after the one all-reduce."""

    per_rank: tuple[int, ...]
    positions: int
    """Target positions in the global batch (global_size x seq_len)."""
    stop: bool = False
    """Some rank was asked to stop (a signal): every rank stops before this step."""
    per_source: tuple[int, ...] = ()
    """A data.sources mixture: the global batch's valid tokens per source (summed over ranks)."""

    @property
    def total(self) -> int:
        return sum(self.per_rank)

    @property
    def padding_fraction(self) -> float:
        return 1.0 - self.total / self.positions if self.positions else 0.0


@dataclass(frozen=True)
class MicroLossContext:
    """What a loss function may use besides one micro-batch's summed token loss."""

    scale: torch.Tensor | float
    """grad_divisor / the step's global valid-token count (a device tensor with several ranks:
    the count is all-reduced on the device and never read back for the loss)."""
    micro_valid: int
    """Valid target tokens of this micro-batch (counted on the CPU copy)."""
    grad_accum: int


LossFn = Callable[[torch.Tensor, MicroLossContext], torch.Tensor]
"""(sum of a micro-batch's token losses, context) -> the quantity it backpropagates."""


def token_exact_loss(loss_sum: torch.Tensor, ctx: MicroLossContext) -> torch.Tensor:
    """The one rule: sum of the micro-batch's token losses / global valid tokens x grad_divisor."""
    return loss_sum * ctx.scale


def per_micro_batch_mean(loss_sum: torch.Tensor, ctx: MicroLossContext) -> torch.Tensor:
    """The known wrong answer, kept as the tests' negative control (debug.broken_normalization):
    each micro-batch's own token mean divided by grad_accum, then averaged over ranks by the
    engine."""
    return loss_sum / max(ctx.micro_valid, 1) / ctx.grad_accum


@dataclass(frozen=True)
class DataRanks:
    """Where a rank's counts go in the step's vector: its data-parallel index among `size`
    streams, and whether it adds them (one rank of each tensor-parallel group does; its peers
    hold the same micro-batches). None in StepCounts: every rank is a data-parallel rank."""

    index: int
    size: int
    counts: bool = True


class StepCounts:
    """The step's one small all-reduce, in flight: [valid tokens of each dp rank..., stop, loss].

    The vector lives on the device; the all-reduce spans every rank (the stop flag is every
    rank's), but a tensor-parallel group adds its tokens and loss sum once. Slot `world` carries
    this rank's stop request (so the ranks agree on a graceful stop without a collective of its
    own); slot `world + 1` carries this rank's summed token loss of the previous step (so the
    logged loss needs no collective of its own either). The all-reduce is started
    asynchronously: the first forward runs while it is in flight. `scale` waits for it in the
    stream (on a GPU the host does not wait; gloo's wait is the host's); `read` is the host
    wait.
    """

    def __init__(
        self,
        local_valid: int,
        stop: bool,
        carry: torch.Tensor | None,
        device: torch.device,
        per_source: tuple[int, ...] = (),
        ranks: DataRanks | None = None,
        carry_bubble: float | None = None,
    ) -> None:
        if ranks is None:
            world = dist.is_initialized()
            ranks = DataRanks(dist.get_rank(), dist.get_world_size()) if world else DataRanks(0, 1)
        everyone = dist.get_world_size() if dist.is_initialized() else 1
        self.world = ranks.size
        self.local = (local_valid, stop, carry)
        self.per_source = per_source
        self.vector: torch.Tensor | None = None
        self._work: Any = None
        self._bubble = carry_bubble is not None
        self.bubble_sum: float | None = carry_bubble
        """A pipeline's previous step: the idle shares of its counting ranks (the last stage's),
        summed over the data-parallel streams once `read`."""
        if everyone == 1:
            return
        sources = slice(self.world + 2, self.world + 2 + len(per_source))
        size = self.world + 2 + len(per_source) + int(self._bubble)
        vector = torch.zeros(size, dtype=torch.float64, device=device)
        if ranks.counts:
            vector[ranks.index] = local_valid
            if per_source:  # a mixture's tokens per source ride along, summed
                vector[sources] = torch.tensor(per_source, dtype=torch.float64)
            if carry is not None:
                vector[self.world + 1] = carry
            if carry_bubble is not None:
                vector[-1] = carry_bubble
        vector[self.world] = float(stop)
        self._work = dist.all_reduce(vector, async_op=True)
        self.vector = vector

    def _arrived(self) -> torch.Tensor:
        assert self.vector is not None
        if self._work is not None:
            self._work.wait()
            self._work = None
        return self.vector

    def scale(self, grad_divisor: float) -> torch.Tensor | float:
        """grad_divisor / global valid tokens (1 token when there are none: the step is skipped,
        every micro-batch's sum is 0, and nothing is NaN)."""
        if self.vector is None:
            return grad_divisor / max(self.local[0], 1)
        total = self._arrived()[: self.world].sum().clamp(min=1.0)
        return (grad_divisor / total).to(torch.float32)

    def read(self, positions: int) -> tuple[StepTokens, torch.Tensor | float | None]:
        """Host wait: the counts, the agreed stop, and the global loss sum carried along."""
        if self.vector is None:
            valid, stop, carry = self.local
            return StepTokens((valid,), positions, stop, self.per_source), carry
        values = self._arrived().tolist()
        if self._bubble:
            self.bubble_sum = values.pop()
        counts = tuple(int(c) for c in values[: self.world])
        sources = tuple(int(c) for c in values[self.world + 2 :])
        tokens = StepTokens(counts, positions, values[self.world] > 0, sources)
        return tokens, values[self.world + 1]


def all_reduce_token_counts(
    local_valid: int, positions: int, device: torch.device, stop: bool = False
) -> StepTokens:
    """One all-reduce of a world-sized vector: every rank learns every rank's valid-token count.

    (A scalar SUM would give the total only; the vector costs the same one collective and also
    gives the per-rank minimum and maximum that are logged.)
    """
    return StepCounts(local_valid, stop, None, device).read(positions)[0]


def reduce_loss_sum(loss_sum: torch.Tensor, counts: bool = True) -> torch.Tensor:
    """The global loss sum of a step whose sum cannot ride on a next step's counts (the last
    step, or the one before a checkpoint): one all-reduce of its own. counts=False: a
    tensor-parallel peer, whose group's sum another rank adds."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        loss_sum = loss_sum.clone() if counts else torch.zeros_like(loss_sum)
        dist.all_reduce(loss_sum)
    return loss_sum
