"""A Hugging Face model's tensor-parallel plan: its family's own `base_model_tp_plan` from
transformers (module pattern -> colwise / rowwise), mapped onto torch's parallel styles and
applied to the base model. The embeddings, norms and the head stay whole on every rank (their
gradients are the same on each), activations between the regions are whole (no sequence
parallelism); the attention counts its local heads from the projections (transformers reshapes
with -1)."""

from __future__ import annotations

from typing import Any

from torch import nn

from launcher.models.tensor_parallel import family_plan


def parallelize_hf(model: nn.Module, mesh: Any) -> nn.Module:
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    plan = family_plan(model) or {}
    base = getattr(model, "base_model", model)
    parallelize_module(base, mesh, {name: styles[style]() for name, style in plan.items()})
    return model
