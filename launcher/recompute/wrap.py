"""Recompute on any model's block list: each block's forward is wrapped in place.

The built-in GPT runs its blocks through `run_blocks`, which a policy replaces (segments of
several blocks included). Any other model runs its blocks in its own loop, with its own
arguments (masks, position embeddings, caches), so here the policy wraps each block's `forward`
on the instance: no module is re-parented, parameter names and state_dict keys stay the model's
own, and an engine may still shard each block afterwards. A block in a recomputed segment is
checkpointed on its own (non-reentrant, RNG preserved, any arguments); a `sqrt` segment of k blocks
therefore keeps the input of each of its blocks, not only the first (k-1 more hidden states).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_leaves
from torch.utils.checkpoint import checkpoint

from launcher.config.ac import AcConfig
from launcher.recompute.segments import SegmentMode, plan_segments, uses_dropout
from launcher.recompute.selective import selective_contexts


class BlockForward:
    """A block's forward under one segment mode (the block's `forward` attribute)."""

    def __init__(
        self, inner: Callable[..., Any], mode: SegmentMode, offload: bool, dropout: bool
    ) -> None:
        self.inner, self.mode, self.offload, self.dropout = inner, mode, offload, dropout

    def _context_fn(self) -> tuple[AbstractContextManager[Any], AbstractContextManager[Any]]:
        return selective_contexts(keep_narrowing=self.dropout)

    def _offload(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> AbstractContextManager[Any]:
        if not self.offload:
            return nullcontext()
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if not tensors or tensors[0].device.type != "cuda":
            return nullcontext()
        return torch.autograd.graph.save_on_cpu(pin_memory=True)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return self.inner(*args, **kwargs)
        with self._offload(args, kwargs):
            if self.mode == SegmentMode.keep:
                return self.inner(*args, **kwargs)
            extra: dict[str, Any] = {}
            if self.mode == SegmentMode.selective:
                extra["context_fn"] = self._context_fn
            return checkpoint(
                self.inner, *args, use_reentrant=False, preserve_rng_state=True, **extra, **kwargs
            )


def unwrap_blocks(blocks: nn.ModuleList) -> None:
    """Remove an earlier policy's wrappers (the class's own forward again)."""
    for block in blocks:
        if isinstance(block.__dict__.get("forward"), BlockForward):
            del block.forward


def wrap_blocks(blocks: nn.ModuleList, cfg: AcConfig) -> list[SegmentMode]:
    """Install the policy on each block; returns each block's mode."""
    unwrap_blocks(blocks)
    segments = plan_segments(cfg.policy, len(blocks), cfg.every_n)
    modes = [s.mode for s in segments for _ in range(s.size)]
    dropout = uses_dropout(blocks)
    for block, mode in zip(blocks, modes, strict=True):
        if mode != SegmentMode.keep or cfg.offload:
            block.forward = BlockForward(block.forward, mode, cfg.offload, dropout)
    return modes


def describe_modes(modes: list[SegmentMode]) -> str:
    recomputed = [i for i, m in enumerate(modes) if m != SegmentMode.keep]
    if not recomputed:
        return "no recompute"
    kind = "selective" if modes[recomputed[0]] == SegmentMode.selective else "recomputed"
    return f"{len(recomputed)} {kind} block(s) of {len(modes)}: {', '.join(map(str, recomputed))}"
