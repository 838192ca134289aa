"""The activation bytes a pipeline rank holds for backward, measured over one schedule step.

While a step runs, `torch.autograd.graph.saved_tensors_hooks` sees every tensor autograd saves on
this rank (its stages' forwards and, on the last stage, the loss), recompute's saved inputs
included. Each storage counts once, while a saved tensor of it is alive: the pack hook hands
autograd a small handle and a finalizer takes the bytes back when autograd frees the node (after
that micro-batch's backward). The peak over the step is what the schedule holds at once, to set
beside the memory plan's per-rank figure (launcher/memory/stages.py). Counted: floating-point
tensors other than parameters, and dropout's masks (the integer token ids, positions and targets
are the batch, not activations).
"""

from __future__ import annotations

import weakref
from types import TracebackType
from typing import Any

import torch
from torch import nn


class _Saved:
    """What autograd keeps instead of the tensor. It holds a detached tensor: one with its
    grad_fn would make a cycle through the C++ graph that gc cannot see, and keep alive a graph
    that is never backpropagated (the first stage's shape-inference forward)."""

    __slots__ = ("__weakref__", "tensor")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


def _local(t: torch.Tensor) -> torch.Tensor:
    to_local = getattr(t, "to_local", None)  # a DTensor (FSDP2 shard, tensor parallel)
    return to_local() if to_local is not None else t


def _is_batch(t: torch.Tensor) -> bool:
    """Token ids, positions and targets (integers): the batch, not activations. Floating-point
    tensors and dropout's boolean masks count."""
    return not (t.is_floating_point() or t.dtype == torch.bool)


def _is_parameter(t: torch.Tensor, parameters: set[int]) -> bool:
    base = t._base if t._base is not None else t
    if isinstance(t, nn.Parameter) or isinstance(base, nn.Parameter):
        return True  # also FSDP2's unsharded parameters, swapped in for the forward
    return _local(t).untyped_storage().data_ptr() in parameters


class SavedBytesMeter:
    """A context manager around one step of `module`'s stages; `peak_bytes` after it."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.live_bytes = 0
        self.peak_bytes = 0
        self._live: dict[int, list[int]] = {}  # storage pointer -> [saved tensors alive, bytes]
        self._hooks: Any = None

    def _pack(self, parameters: set[int]) -> Any:
        def pack(t: torch.Tensor) -> Any:
            if _is_batch(t) or _is_parameter(t, parameters):
                return t
            storage = _local(t).untyped_storage()
            key = storage.data_ptr()
            entry = self._live.setdefault(key, [0, storage.nbytes()])
            if entry[0] == 0:
                self.live_bytes += entry[1]
                self.peak_bytes = max(self.peak_bytes, self.live_bytes)
            entry[0] += 1
            handle = _Saved(t.detach())
            weakref.finalize(handle, self._release, key)
            return handle

        return pack

    @staticmethod
    def _unpack(handle: Any) -> torch.Tensor:
        return handle.tensor if isinstance(handle, _Saved) else handle

    def _release(self, key: int) -> None:
        entry = self._live.get(key)
        if entry is None:
            return
        entry[0] -= 1
        if entry[0] == 0:
            self.live_bytes -= entry[1]
            del self._live[key]

    def __enter__(self) -> SavedBytesMeter:
        parameters = {
            _local(p).untyped_storage().data_ptr()
            for p in self.module.parameters()
            if not p.is_meta
        }
        self.peak_bytes = self.live_bytes = 0  # what an earlier step left is not this step's
        self._live.clear()
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack(parameters), self._unpack)
        self._hooks.__enter__()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._hooks.__exit__(kind, error, trace)
        self._hooks = None
