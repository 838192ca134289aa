"""`launch verify`: the exactness certificate of a split."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from launcher.config.checks import require_positive


class VerifyPrecision(str, Enum):
    fp32 = "fp32"
    bf16 = "bf16"
    train = "train"


@dataclass
class VerifyConfig:
    """Run the configured split and a one-big-batch reference for a few steps and compare."""

    steps: int = 3
    """Optimizer steps compared (gradients of every parameter after step 1)."""
    precision: VerifyPrecision = VerifyPrecision.fp32
    """fp32 (the exact comparison) | bf16 | train (train.precision)."""
    first: bool = False
    """With `launch train`: verify the split before training and refuse to start when it fails."""

    def __post_init__(self) -> None:
        require_positive("verify.steps", self.steps)
