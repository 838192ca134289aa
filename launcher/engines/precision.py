"""train.precision -> torch dtype and bytes per element: the one map for the whole project.

The plan's memory estimates, the activation measurement, each engine's autocast or cast of the
model, and the fp16 loss scaling all read it here.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

from launcher.config.train import Precision

DTYPE: dict[Precision, torch.dtype] = {
    Precision.fp32: torch.float32,
    Precision.bf16: torch.bfloat16,
    Precision.fp16: torch.float16,
}
"""The dtype the forward computes in (parameters and optimizer states stay fp32 unless an
engine keeps a 16-bit model, as DeepSpeed does)."""


def dtype(precision: Precision) -> torch.dtype:
    return DTYPE[precision]


def bytes_per_element(precision: Precision) -> int:
    """4 for fp32, 2 for bf16 and fp16."""
    return DTYPE[precision].itemsize


def is_reduced(precision: Precision) -> bool:
    """True for bf16 and fp16: something has to cast (autocast, a mixed-precision policy)."""
    return DTYPE[precision] != torch.float32


def reduced_dtype(precision: Precision) -> torch.dtype | None:
    """The 16-bit compute dtype, or None for fp32 (nothing to cast)."""
    return DTYPE[precision] if is_reduced(precision) else None


def needs_loss_scaling(precision: Precision) -> bool:
    """fp16 only: its narrow exponent underflows small gradients without a loss scale."""
    return DTYPE[precision] == torch.float16


def autocast(precision: Precision, device: torch.device) -> AbstractContextManager[Any]:
    """Mixed precision for a forward on `device`; nullcontext in fp32."""
    if not is_reduced(precision):
        return nullcontext()
    return torch.autocast(device_type=device.type, dtype=DTYPE[precision])
