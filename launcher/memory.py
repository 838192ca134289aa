"""Activation memory and recompute cost of one micro-batch, measured (not estimated)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from launcher.config.root import RootConfig


def activation_report(
    cfg: RootConfig, model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor
) -> dict[str, Any]:
    """Figures for summary.json: activation_bytes, activation_peak_bytes, recompute_flops_ratio.

    Filled in by the recompute work; returns what it can measure.
    """
    del cfg, model, inputs, targets
    return {}
