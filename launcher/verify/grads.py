"""Full (unsharded, synchronised) gradients and running statistics of a model under any engine.

Collective: every rank calls these at the same point, between the step's last backward and its
optimizer step (the gradients are gone after it); rank 0 keeps the result. Each engine gathers
its own gradients (Engine.full_gradient, launcher/engines/); here they get the user's names.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from launcher.engines.base import Engine
from launcher.models.names import plain_name


def _full(tensor: torch.Tensor) -> torch.Tensor:
    if isinstance(tensor, DTensor):
        tensor = tensor.full_tensor()
    return tensor.detach().float().cpu().clone()


def full_gradients(engine: Engine) -> dict[str, torch.Tensor]:
    """name -> the full fp32 gradient on the CPU, for every trainable parameter of the engine's
    model (zeros for one that got no gradient)."""
    return {
        plain_name(name): _full(engine.full_gradient(param))
        for name, param in engine.module.named_parameters()
        if param.requires_grad
    }


def running_statistics(model: nn.Module) -> dict[str, torch.Tensor]:
    """The floating buffers of batch-dependent layers (running mean and variance): what a layer
    learned from the batches it saw."""
    from launcher.worker.run import BATCH_DEPENDENT

    stats: dict[str, torch.Tensor] = {}
    for module_name, module in model.named_modules():
        if not isinstance(module, BATCH_DEPENDENT):
            continue
        for buffer_name, buffer in module.named_buffers(recurse=False):
            if buffer is not None and buffer.is_floating_point():
                key = plain_name(f"{module_name}.{buffer_name}")
                stats[key] = _full(buffer)
    return stats
