"""The token-exact loss: every optimizer step minimises the mean over all valid target tokens of
the whole global batch, whatever the split into ranks and micro-batches.

Per step, each rank counts the valid tokens of all its micro-batches; one all-reduce gives every
rank every rank's count. Each micro-batch then backpropagates

    sum of its token losses / global valid tokens * grad_divisor

where grad_divisor undoes the engine's own averaging (DDP divides gradients by the dp size).
Summed over micro-batches and ranks this is exactly the gradient of the global token mean.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from launcher.data.sequence import IGNORE_INDEX


def token_loss_sum(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Sum (not mean) of cross-entropy over targets != -100, in fp32."""
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

    @property
    def total(self) -> int:
        return sum(self.per_rank)

    @property
    def padding_fraction(self) -> float:
        return 1.0 - self.total / self.positions if self.positions else 0.0


def all_reduce_token_counts(
    local_valid: int, positions: int, device: torch.device, stop: bool = False
) -> StepTokens:
    """One all-reduce of a world-sized vector: every rank learns every rank's valid-token count.

    (A scalar SUM would give the total only; the vector costs the same one collective and also
    gives the per-rank minimum and maximum that are logged.) One extra slot carries this rank's
    stop request, so the ranks agree on a graceful stop without a collective of its own.
    """
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return StepTokens((local_valid,), positions, stop)
    world = dist.get_world_size()
    counts = torch.zeros(world + 1, dtype=torch.float64, device=device)
    counts[dist.get_rank()] = local_valid
    counts[world] = float(stop)
    dist.all_reduce(counts)
    values = counts.tolist()
    return StepTokens(tuple(int(c) for c in values[:world]), positions, values[world] > 0)


def micro_loss(
    loss_sum: torch.Tensor,
    tokens: StepTokens,
    grad_divisor: float,
    *,
    micro_valid: int = 0,
    grad_accum: int = 1,
    broken_normalization: bool = False,
) -> torch.Tensor:
    """The quantity one micro-batch backpropagates.

    broken_normalization is the negative control (a per-micro-batch mean divided by grad_accum,
    then averaged over ranks by the engine): tests use it to show they can tell the difference.
    """
    if broken_normalization:
        return loss_sum / max(micro_valid, 1) / grad_accum
    return loss_sum * (grad_divisor / tokens.total)
