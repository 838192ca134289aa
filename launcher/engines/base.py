"""The engine interface the training loop talks to; the loop never branches on the engine name."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from concurrent.futures import Future
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from launcher.config.root import RootConfig
from launcher.engines import precision

if TYPE_CHECKING:
    from launcher.parallel.pipeline_norm import PipelineGradients


class Engine(ABC):
    """One rank's view of the model under a distributed engine."""

    model: nn.Module
    """What the training forward is called on (possibly wrapped)."""
    module: nn.Module
    """The bare model (evaluation, parameter count, recompute policies)."""
    grad_divisor: float
    """How many times the engine divides the summed gradient; the loss multiplies it back."""
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler

    def __init__(self, cfg: RootConfig) -> None:
        self.cfg = cfg

    @abstractmethod
    def accumulation_context(self, sync: bool) -> AbstractContextManager[Any]:
        """Around forward and backward of one micro-batch; sync=False skips gradient sync."""

    @abstractmethod
    def backward(self, loss: torch.Tensor) -> None:
        """Backward of one micro-batch's (already token-normalised) loss."""

    @abstractmethod
    def step(self) -> torch.Tensor:
        """Clip, step the optimizer and scheduler once, zero gradients; return the grad norm.

        The norm stays a (0-dim) tensor on the device: reading it is the caller's host sync."""

    @property
    @abstractmethod
    def lr(self) -> float:
        """The learning rate the next step uses."""

    def autocast(self) -> AbstractContextManager[Any]:
        """Mixed precision for forward; engines that cast the model themselves return
        nullcontext."""
        device = next(self.module.parameters()).device
        return precision.autocast(self.cfg.train.precision, device)

    @property
    def clip_norm(self) -> float:
        """optim.grad_clip, with 0 meaning 'measure, do not clip'."""
        return self.cfg.optim.grad_clip or math.inf

    def full_gradient(self, param: nn.Parameter) -> torch.Tensor:
        """Collective (every rank, the same parameters in the same order): the whole gradient of
        one of self.module's parameters as this step's backward left it, before the optimizer
        step; zeros of the parameter's full shape when it got none (launcher/verify/grads.py)."""
        if param.grad is None:
            return torch.zeros(tuple(param.shape))
        full = getattr(param.grad, "full_tensor", None)  # a DTensor (tp, FSDP2): gathered
        return full() if full is not None else param.grad

    # Checkpoints (launcher/checkpoint/checkpointer.py): each engine writes its own format.

    @abstractmethod
    def save_checkpoint(self, directory: Path, client_state: dict[str, Any]) -> None:
        """Collective: write this rank's part of the engine state under `directory`.

        client_state (step, totals) is also in the checkpoint's meta.json; engines may ignore it.
        """

    def save_checkpoint_async(self, directory: Path, group: dist.ProcessGroup) -> Future[Any]:
        """Collective: what save_checkpoint writes, from a copy taken now, written in the
        background (checkpoint.async=true; the config refuses it for engines without it)."""
        raise NotImplementedError(f"{type(self).__name__} has no asynchronous checkpoints")

    @abstractmethod
    def load_checkpoint(self, directory: Path) -> dict[str, Any]:
        """Collective: restore what save_checkpoint wrote (resharding where the format can)."""


class TorchOptimizerEngine(Engine):
    """An engine whose optimizer step is plain PyTorch: AdamW, the schedule, a GradScaler (ddp,
    fsdp).

    Its checkpoint is torch.distributed.checkpoint (DCP), which reshards on load.
    """

    scaler: torch.amp.GradScaler
    """The fp16 loss scaler (disabled unless fp16), saved in the checkpoint with the optimizer."""

    def dcp_state(self) -> dict[str, Any]:
        """The training state as DCP Stateful objects: model and optimizer (through DCP's
        state_dict helpers, which understand DDP and FSDP wrappers), scheduler, loss scaler."""
        from launcher.engines.dcp import MODEL_AND_OPTIMIZER, ModelAndOptimizer

        return {
            MODEL_AND_OPTIMIZER: ModelAndOptimizer(self.model, self.optimizer),
            "scheduler": self.scheduler,
            "scaler": self.scaler,
        }

    def save_checkpoint(self, directory: Path, client_state: dict[str, Any]) -> None:
        from launcher.engines import dcp

        del client_state  # in meta.json already
        dcp.save(directory, self.dcp_state())

    def save_checkpoint_async(self, directory: Path, group: dist.ProcessGroup) -> Future[Any]:
        from launcher.engines import dcp

        return dcp.save_async(directory, self.dcp_state(), group)

    def load_checkpoint(self, directory: Path) -> dict[str, Any]:
        from launcher.engines import dcp

        dcp.load(directory, self.dcp_state())
        return {}

    def backward(self, loss: torch.Tensor) -> None:
        self.scaler.scale(loss).backward()

    def global_norm(self, norm: torch.Tensor) -> torch.Tensor:
        """The gradient norm over all ranks (sharded engines override)."""
        return norm

    tensor_parallel: bool = False
    """Parameters are DTensors on a tp mesh (parallel.tp > 1): the norm is combined per mesh."""
    pipeline: PipelineGradients | None = None
    """A pipeline stage (parallel.pp > 1): the tied weight summed across the stages, the norm
    reduced over them (launcher/parallel/pipeline_norm.py)."""

    def clip_gradients(self) -> torch.Tensor:
        """Clip to optim.grad_clip; the gradient norm of the whole model, equal to one
        process's."""
        if self.pipeline is not None:
            return self.pipeline.clip(self.clip_norm)
        if self.tensor_parallel:  # clip_grad_norm_ refuses parameters on different meshes
            from launcher.parallel.norm import clip_by_total_norm

            return clip_by_total_norm(list(self.module.parameters()), self.clip_norm)
        norm = torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.clip_norm)
        return self.global_norm(norm)

    def step(self) -> torch.Tensor:
        self.scaler.unscale_(self.optimizer)
        if self.pipeline is not None:  # the tied weight's two copies: one gradient
            self.pipeline.sync()
        norm = self.clip_gradients()
        self.scaler.step(self.optimizer)  # fp16 only: reads found_inf on the host
        self.scaler.update()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm.detach()

    @property
    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])
