"""The engine interface the training loop talks to; the loop never branches on the engine name."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch import nn

from launcher.config.root import RootConfig
from launcher.config.train import Precision


class Engine(ABC):
    """One rank's view of the model under a distributed engine."""

    model: nn.Module
    """What the training forward is called on (possibly wrapped)."""
    module: nn.Module
    """The bare model (evaluation, parameter count, recompute policies)."""
    grad_divisor: float
    """How many times the engine divides the summed gradient; the loss multiplies it back."""

    def __init__(self, cfg: RootConfig) -> None:
        self.cfg = cfg

    @abstractmethod
    def accumulation_context(self, sync: bool) -> AbstractContextManager[Any]:
        """Around forward and backward of one micro-batch; sync=False skips gradient sync."""

    @abstractmethod
    def backward(self, loss: torch.Tensor) -> None:
        """Backward of one micro-batch's (already token-normalised) loss."""

    @abstractmethod
    def step(self) -> float:
        """Clip, step the optimizer and scheduler once, zero gradients; return the grad norm."""

    @property
    @abstractmethod
    def lr(self) -> float:
        """The learning rate the next step uses."""

    def autocast(self) -> AbstractContextManager[Any]:
        """Mixed precision for forward; engines that cast the model themselves return nullcontext."""
        precision = self.cfg.train.precision
        if precision == Precision.fp32:
            return nullcontext()
        dtype = torch.bfloat16 if precision == Precision.bf16 else torch.float16
        device = next(self.module.parameters()).device
        return torch.autocast(device_type=device.type, dtype=dtype)

    @property
    def clip_norm(self) -> float:
        """optim.grad_clip, with 0 meaning 'measure, do not clip'."""
        return self.cfg.optim.grad_clip or math.inf

    def state_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    def load_state_dict(self, state: dict[str, Any]) -> None:
        raise NotImplementedError
