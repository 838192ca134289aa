"""Packed documents inside one sequence: where each starts, and who may attend to whom.

A packed sequence carries position ids that restart where a document starts (launcher/data/
packed.py builds them). The rule is transformers' own (masking_utils.find_packed_sequence_indices):
a new document starts wherever a position is not the previous one + 1. So the built-in GPT and a
transformers model given the same `position_ids` draw the same boundaries: a token attends to the
earlier tokens of its own document only (block-causal), and reads its own position embedding.
"""

from __future__ import annotations

import inspect

import torch
from torch import nn

from launcher.errors import ConfigError


def document_ids(position_ids: torch.Tensor) -> torch.Tensor:
    """(batch, time) -> (batch, time): 0, 0, 1, 1, 1, 2 ... the document of each token."""
    first = position_ids[:, :1] - 1
    return (torch.diff(position_ids, prepend=first, dim=-1) != 1).cumsum(-1)


def block_causal_mask(position_ids: torch.Tensor) -> torch.Tensor:
    """(batch, 1, time, time) bool, True where query t may attend to key s: s <= t and both in
    one document (scaled_dot_product_attention's attn_mask)."""
    docs = document_ids(position_ids)
    t = position_ids.shape[-1]
    causal = torch.ones(t, t, dtype=torch.bool, device=position_ids.device).tril()
    return (causal & (docs[:, :, None] == docs[:, None, :]))[:, None]


def takes_position_ids(model: nn.Module) -> bool:
    """Whether `model(input_ids, position_ids=...)` is accepted (a named argument or **kwargs)."""
    forward = getattr(model.forward, "inner", model.forward)  # through LogitsForward
    try:
        params = inspect.signature(forward).parameters.values()
    except (TypeError, ValueError):
        return True  # cannot tell: the forward's own error will say
    return any(p.name == "position_ids" or p.kind == p.VAR_KEYWORD for p in params)


def require_position_ids(model: nn.Module) -> None:
    """Packed documents need a model that takes position_ids; one clear error otherwise."""
    if not takes_position_ids(model):
        raise ConfigError(
            "data.packing",
            f"the data packs several documents per sequence with their own positions and "
            f"attention, and {type(model).__name__}.forward takes no position_ids argument.",
            "add `position_ids=None` to the model's forward (see docs/data.md), or keep "
            "today's attention across documents with data.packing=concat "
            "data.cross_document_attention=true.",
        )
