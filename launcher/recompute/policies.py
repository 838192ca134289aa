"""Activation-checkpoint policies (recompute, not model checkpoints).

A policy is a closed set of choices (`ac=none|full|every_n|sqrt|selective`) turned into a plan of
*segments*: runs of consecutive blocks that are either kept (every activation saved), recomputed
as one unit (only the segment's input is kept), or selectively recomputed (matmul and attention
outputs kept, cheap ops recomputed). `apply_recompute` installs that plan as the model's
`run_blocks`, after the model is built and before an engine wraps it. No block is re-parented, so
parameter names and state_dict keys are identical under every policy, and an engine may still
shard each block (FSDP2's `fully_shard`) after the policy is applied.

Recompute uses non-reentrant `torch.utils.checkpoint` with the RNG state preserved, so dropout
draws the same masks in the recomputation as in the forward and gradients do not change.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Protocol

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from launcher.config.ac import AcConfig, AcPolicy
from launcher.logs import get_logger
from launcher.recompute.segments import Segment, SegmentMode, plan_segments, uses_dropout
from launcher.recompute.selective import selective_contexts
from launcher.recompute.wrap import describe_modes, wrap_blocks

log = get_logger("recompute")


def _run_range(
    blocks: Sequence[nn.Module], x: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    for block in blocks:
        x = block(x) if mask is None else block(x, mask=mask)
    return x


@functools.cache
def _offload_notice() -> None:
    log.info(
        "ac.offload=true: saved activations already live in host memory on CPU; nothing to offload."
    )


class RecomputeRunner:
    """Runs a model's blocks segment by segment (the model's `run_blocks`)."""

    def __init__(
        self, segments: Sequence[Segment], offload: bool = False, dropout: bool = False
    ) -> None:
        self.segments = tuple(segments)
        self.offload = offload
        self._selective = functools.partial(selective_contexts, keep_narrowing=dropout)

    def __call__(
        self, blocks: nn.ModuleList, x: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Run the blocks; mask: packed documents' block-causal mask, passed to every block."""
        if self.segments and self.segments[-1].stop != len(blocks):
            raise ValueError(
                f"the recompute plan covers {self.segments[-1].stop} blocks, the model has "
                f"{len(blocks)}"
            )
        with self._offload_context(x):
            for seg in self.segments:
                run: Callable[..., torch.Tensor] = functools.partial(
                    _run_range, [blocks[i] for i in range(seg.start, seg.stop)]
                )
                if seg.mode == SegmentMode.keep or not torch.is_grad_enabled():
                    x = run(x, mask)
                elif seg.mode == SegmentMode.full:
                    x = checkpoint(run, x, mask, use_reentrant=False, preserve_rng_state=True)
                else:
                    x = checkpoint(
                        run,
                        x,
                        mask,
                        use_reentrant=False,
                        preserve_rng_state=True,
                        context_fn=self._selective,
                    )
        return x

    def _offload_context(self, x: torch.Tensor) -> AbstractContextManager[Any]:
        if not self.offload or not torch.is_grad_enabled():
            return nullcontext()
        if x.device.type != "cuda":
            _offload_notice()
            return nullcontext()
        # Whatever the policy keeps outside recompute regions goes to pinned host memory.
        return torch.autograd.graph.save_on_cpu(pin_memory=True)

    def describe(self) -> str:
        recomputed = [s for s in self.segments if s.mode != SegmentMode.keep]
        if not recomputed:
            return "no recompute"
        parts = [f"{s.start}" if s.size == 1 else f"{s.start}-{s.stop - 1}" for s in recomputed]
        mode = "selective" if recomputed[0].mode == SegmentMode.selective else "recomputed"
        return f"{len(recomputed)} {mode} segment(s), blocks {', '.join(parts)}"


class HasBlocks(Protocol):
    """What a policy needs from a model: its block list and the function that runs it."""

    blocks: nn.ModuleList
    run_blocks: Callable[..., torch.Tensor]


def build_runner(cfg: AcConfig, blocks: nn.ModuleList) -> RecomputeRunner:
    segments = plan_segments(cfg.policy, len(blocks), cfg.every_n)
    return RecomputeRunner(segments, cfg.offload, dropout=uses_dropout(blocks))


def has_block_runner(model: nn.Module) -> bool:
    """The built-in GPT's shape: `blocks` run by a replaceable `run_blocks`."""
    return isinstance(getattr(model, "blocks", None), nn.ModuleList) and hasattr(
        model, "run_blocks"
    )


def apply_recompute(model: nn.Module, cfg: AcConfig, blocks_path: str | None = None) -> str:
    """Install the policy (before any engine wraps the model); returns what it does, in words.

    A model with `run_blocks` (the built-in GPT) gets a RecomputeRunner: segments of several
    blocks recomputed as one. Any other model gets each block's forward wrapped
    (launcher/recompute/wrap.py) on the block list found by launcher.models.blocks; with no block
    list, any policy but `none` is refused."""
    from launcher.models.blocks import find_blocks, require_blocks

    if has_block_runner(model) and not blocks_path:
        gpt: Any = model
        runner = build_runner(cfg, gpt.blocks)
        gpt.run_blocks = runner
        recomputes = any(s.mode != SegmentMode.keep for s in runner.segments)
        described = runner.describe()
    else:
        if cfg.policy == AcPolicy.none:
            found = find_blocks(model, blocks_path)
        else:
            found = require_blocks(model, blocks_path, f"ac={cfg.policy.value}")
        if found is None:
            return "no recompute"
        modes = wrap_blocks(found.blocks, cfg)
        recomputes = any(m != SegmentMode.keep for m in modes)
        described = f"{found.path}: {describe_modes(modes)}"
    if recomputes:  # ac=none: the plan said so
        log.info(f"recompute: ac={cfg.policy.value}: {described}")
    return described
