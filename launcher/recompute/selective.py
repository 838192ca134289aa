"""The op policy of `ac=selective`: which op outputs a checkpointed block keeps.

Kept: the matmuls and the fused attention kernels (the expensive work). Recomputed: everything
else in a block (norms, GELU, softmax, dropout, reshapes), which is cheap to rerun and often
memory-heavy (Korthikanti et al. 2022; Megatron-LM's selective recompute). Two refinements:

- a narrowing matmul (fewer output than input features: the MLP's down projection) feeds only
  the residual stream and nothing in backward needs its output; recompute stops before it
  (torch's checkpoint early stop), so keeping it would cost memory for nothing. When the blocks
  use dropout, recompute must rerun it to redraw the mask after it, so then it is kept;
- an in-place op on a kept output is kept as well. Rerunning it in recompute would apply it a
  second time to the kept tensor (DeepSpeed ZeRO-3's linear adds its bias in place to the matmul
  output), and since the mutation goes through an `_unsafe_view`, PyTorch's own mutation check
  does not see it. Hence cache entries may be mutated (`allow_cache_entry_mutation`): SAC records
  an in-place op's version before the op bumps it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

aten = torch.ops.aten

_KEPT_OP_NAMES = (
    "bmm",
    "baddbmm",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_fused_attention_overrideable",
)
KEPT_OPS = frozenset(getattr(aten, name).default for name in _KEPT_OP_NAMES if hasattr(aten, name))
# Linear layers, as 2-D matmuls: (operand index of the input, of the weight).
LINEAR_OPS = {aten.mm.default: (0, 1), aten.addmm.default: (1, 2)}


def _storage(t: Any) -> int | None:
    return t.untyped_storage().data_ptr() if isinstance(t, torch.Tensor) else None


class _OpPolicy:
    """Decides per op; remembers the storages of kept outputs within one checkpointed call."""

    def __init__(self, keep_narrowing: bool) -> None:
        self.keep_narrowing = keep_narrowing
        self.kept_storages: set[int] = set()

    def keeps(self, op: Any, args: tuple[Any, ...]) -> bool:
        if op._schema.is_mutable:
            random = torch.Tag.nondeterministic_seeded in op.tags
            return not random and bool(args) and _storage(args[0]) in self.kept_storages
        if op in LINEAR_OPS:
            i, w = LINEAR_OPS[op]
            narrowing = args[w].shape[-1] < args[i].shape[-1]
            return self.keep_narrowing or not narrowing
        return op in KEPT_OPS

    def __call__(self, ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        del ctx, kwargs
        return (
            CheckpointPolicy.MUST_SAVE
            if self.keeps(op, args)
            else CheckpointPolicy.PREFER_RECOMPUTE
        )


class _NoteKept(TorchDispatchMode):
    """Above SAC's caching mode in forward: records the storages of the outputs it keeps."""

    def __init__(self, policy: _OpPolicy) -> None:
        super().__init__()
        self.policy = policy

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if self.policy.keeps(func, tuple(args)):
            for leaf in tree_leaves(out):
                ptr = _storage(leaf)
                if ptr is not None:
                    self.policy.kept_storages.add(ptr)
        return out


@contextmanager
def _forward(caching: AbstractContextManager[Any], policy: _OpPolicy) -> Iterator[None]:
    # Entered second, the noting mode sits above SAC's and sees each op's output after it.
    with caching, _NoteKept(policy):
        yield


def selective_contexts(
    keep_narrowing: bool,
) -> tuple[AbstractContextManager[Any], AbstractContextManager[Any]]:
    """A `context_fn` for torch.utils.checkpoint: fresh (forward, recompute) contexts per call."""
    policy = _OpPolicy(keep_narrowing)
    caching, cached = create_selective_checkpoint_contexts(policy, allow_cache_entry_mutation=True)
    return _forward(caching, policy), cached
