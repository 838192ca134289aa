"""A model's own tensor-parallel plan (model.tp_plan) on the ranks: each layer the plan names
(resolved as the plan-time check resolved it, launcher/models/tp_plan.py) split with torch's
ColwiseParallel or RowwiseParallel over the mesh's tp dimension; norms, position tables and every
layer the plan leaves out stay whole on every rank (their gradients are the same on each), and a
weight tied between two layers is one DTensor again afterwards."""

from __future__ import annotations

from typing import Any

from torch import nn

from launcher.models.tp_plan import Planned, resolve, tied_groups


def torch_style(layer: Planned) -> Any:
    """The parallel style of one planned layer, in torch's terms."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    if layer.style == "colwise":
        return ColwiseParallel()  # the outputs stay split: the next layer reads its shard
    if layer.style == "colwise_rep":
        return ColwiseParallel(output_layouts=Replicate())  # gathered whole (logits)
    if isinstance(layer.module, nn.Embedding):  # token ids are whole on every rank
        return RowwiseParallel(input_layouts=Replicate())
    return RowwiseParallel()  # split inputs, partial outputs summed (all-reduce)


def parallelize_user(model: nn.Module, mesh: Any, plan: dict[str, str]) -> nn.Module:
    """Split the model's planned layers over `mesh` (the tp dimension) in place."""
    from torch.distributed.tensor.parallel import parallelize_module

    ties = tied_groups(model)
    for layer in resolve(model, plan):
        parallelize_module(layer.module, mesh, torch_style(layer))
    for (first, name), *others in ties:  # the checked plan splits a tied weight alike
        shared = getattr(first, name)
        for module, other in others:
            setattr(module, other, shared)
    return model
