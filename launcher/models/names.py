"""The user's own names for a model's parameters and buffers, under the wrappers that recompute,
compile and the engines put between a module and its children."""

from __future__ import annotations

WRAPPER_INFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")
"""Inserted inside a name by checkpoint_wrapper, torch.compile and FSDP1."""


def plain_name(name: str) -> str:
    """`name` without the wrappers' infixes (the model the user wrote has none of them)."""
    for infix in WRAPPER_INFIXES:
        name = name.replace(infix, "")
    return name
