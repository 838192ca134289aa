"""What a model's forward returns, as logits: a tensor, or an object with `.logits` (Hugging Face
outputs). The launcher computes the loss itself from the logits, never from the model's own
`labels=` loss (a per-micro-batch mean, the averaging the token-exact loss replaces)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn


def logits_of(output: Any) -> torch.Tensor | None:
    """The logits in a forward's output, or None when there are none."""
    if isinstance(output, torch.Tensor):
        return output
    logits = getattr(output, "logits", None)
    if logits is None and isinstance(output, dict):
        logits = output.get("logits")
    return logits if isinstance(logits, torch.Tensor) else None


class LogitsForward:
    """A model's forward that returns its logits tensor (installed on the instance, so no module
    is re-parented and parameter names stay the model's own)."""

    def __init__(self, forward: Callable[..., Any]) -> None:
        self.inner = forward

    def __call__(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        output = self.inner(*args, **kwargs)
        logits = logits_of(output)
        if logits is None:
            raise TypeError(f"the model's forward returned {type(output).__name__}, not logits")
        return logits


def return_logits(model: nn.Module) -> nn.Module:
    """Make `model(input_ids)` return the logits tensor, whatever the forward returns."""
    if not isinstance(model.forward, LogitsForward):
        model.forward = LogitsForward(model.forward)
    return model
