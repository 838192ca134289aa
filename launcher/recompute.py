"""Activation-checkpoint policies (recompute, not model checkpoints), applied to the model's block
list after it is built and before the engine wraps it."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from launcher.config.ac import AcConfig, AcPolicy
from launcher.errors import ConfigError


class CheckpointedBlock(nn.Module):
    """Runs `inner` under non-reentrant checkpointing: only its input is kept for backward."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.inner, x, use_reentrant=False, preserve_rng_state=True)


def apply_recompute(blocks: nn.ModuleList, cfg: AcConfig) -> None:
    """Wrap blocks in place according to the policy."""
    if cfg.policy == AcPolicy.none:
        return
    if cfg.policy == AcPolicy.full:
        for i, block in enumerate(blocks):
            blocks[i] = CheckpointedBlock(block)
        return
    raise ConfigError("ac", f"granularity {cfg.policy.value} is not implemented yet.", "use ac=none or ac=full.")
