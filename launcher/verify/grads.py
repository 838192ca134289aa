"""Full (unsharded, synchronised) gradients and running statistics of a model under any engine.

Collective: every rank calls these at the same point, between the step's last backward and its
optimizer step (the gradients are gone after it); rank 0 keeps the result.

- ddp, one rank: `p.grad` is already the all-reduced gradient.
- fsdp (FSDP2): parameters and their gradients are DTensor shards; `full_tensor()` gathers.
- deepspeed: ZeRO 1-3 keep gradients in the optimizer's partitions;
  `deepspeed.utils.safe_get_full_grad` assembles the fp32 gradient (stage 0: `p.grad`).
"""

from __future__ import annotations

import sys

import torch
from torch import nn
from torch.distributed.tensor import DTensor

# Wrappers some libraries insert between a module and its children: not part of the model's
# own names (the reference runs without them).
_WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")


def plain_name(name: str) -> str:
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def _full(tensor: torch.Tensor) -> torch.Tensor:
    if isinstance(tensor, DTensor):
        tensor = tensor.full_tensor()
    return tensor.detach().float().cpu().clone()


def _gradient(param: nn.Parameter) -> torch.Tensor | None:
    """The full gradient of one parameter (collective under ZeRO and FSDP)."""
    deepspeed = sys.modules.get("deepspeed")  # imported only when engine=deepspeed built it
    if deepspeed is not None and (
        hasattr(param, "ds_id") or hasattr(param, "_hp_mapping") or hasattr(param, "_hp_grad")
    ):
        grad = deepspeed.utils.safe_get_full_grad(param)
    else:
        grad = param.grad
    return None if grad is None else _full(grad)


def full_gradients(model: nn.Module) -> dict[str, torch.Tensor]:
    """name -> the full fp32 gradient on the CPU, for every trainable parameter (zeros for one
    that got no gradient)."""
    grads: dict[str, torch.Tensor] = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        grad = _gradient(param)
        if grad is None:
            shape = param.ds_shape if hasattr(param, "ds_shape") else param.shape
            grad = torch.zeros(tuple(shape))
        grads[plain_name(name)] = grad
    return grads


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
