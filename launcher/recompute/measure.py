"""Activation memory and recompute cost of one micro-batch, measured (not estimated).

`ActivationTracker` watches every op (a TorchDispatchMode, so it also sees what autograd and
activation checkpointing do in backward) and keeps a weak reference to each new storage an op
creates; a storage counts as live until its last tensor is freed. Parameters, their gradients and
the batch itself exist before the measurement starts and never count. FLOPs come from
`torch.utils.flop_counter.FlopCounterMode` (with the CPU fused-attention kernel added), in a pass
of their own: its module tracking keeps recomputed tensors alive, which would inflate the bytes.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from launcher.adapters.apply import apply_adapter
from launcher.config.ac import AcConfig, AcPolicy
from launcher.config.model import blocks_path
from launcher.config.root import RootConfig
from launcher.engines.precision import autocast as precision_autocast
from launcher.models import build_model
from launcher.recompute.policies import apply_recompute
from launcher.training.loss import token_loss_sum

aten = torch.ops.aten


class ActivationTracker(TorchDispatchMode):
    """Live bytes of the storages that ops create while it is active, and their peak."""

    def __init__(self, existing: Iterable[torch.Tensor] = ()) -> None:
        super().__init__()
        # Held strongly, so that no new storage can take one of their ids while we compare.
        self._existing = {id(s): s for s in (t.untyped_storage() for t in existing)}
        self._live: dict[int, tuple[weakref.ref[torch.UntypedStorage], int]] = {}
        self.live_bytes = 0
        self.peak_bytes = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                self._track(leaf.untyped_storage())
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        return out

    def _track(self, storage: torch.UntypedStorage) -> None:
        # PyTorch keeps one Python object per live storage, so its id names the storage (views
        # share it) until it is freed, and a weak reference to it dies exactly then.
        key = id(storage)
        if key in self._existing or key in self._live:
            return
        nbytes = storage.nbytes()
        self._live[key] = (weakref.ref(storage, self._on_free(key)), nbytes)
        self.live_bytes += nbytes

    def _on_free(self, key: int) -> Any:
        def callback(_: object) -> None:
            entry = self._live.pop(key, None)
            if entry is not None:
                self.live_bytes -= entry[1]

        return callback


def _cpu_sdpa_flops(query: Any, key: Any, value: Any, *args: Any, **kwargs: Any) -> int:
    del args, kwargs
    return int(sdpa_flop_count(query, key, value))


def _cpu_sdpa_backward_flops(
    grad_out: Any, query: Any, key: Any, value: Any, *args: Any, **kwargs: Any
) -> int:
    del args, kwargs
    return int(sdpa_backward_flop_count(grad_out, query, key, value))


# FlopCounterMode knows the CUDA attention kernels but not the CPU one (arguments arrive as shapes).
_CPU_ATTENTION_FLOPS: dict[Any, Any] = {}
if hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu"):
    _CPU_ATTENTION_FLOPS = {
        aten._scaled_dot_product_flash_attention_for_cpu: _cpu_sdpa_flops,
        aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_sdpa_backward_flops,
    }


def flop_counter() -> FlopCounterMode:
    return FlopCounterMode(display=False, custom_mapping=_CPU_ATTENTION_FLOPS)


@dataclass(frozen=True)
class ActivationBytes:
    saved: int
    """Bytes held for backward at the end of the forward (loss computed, logits released)."""
    peak: int
    """Peak live activation bytes over forward and backward, recompute included."""


def _forward_loss(
    model: nn.Module,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    autocast: AbstractContextManager[Any] | None,
) -> torch.Tensor:
    # A function of its own so that the logits are released when it returns, as in training.
    with autocast or nullcontext():
        logits = model(inputs)
    return token_loss_sum(logits, targets)


def _preallocate_grads(model: nn.Module) -> list[torch.Tensor]:
    """Give every parameter a gradient, so backward accumulates in place and never counts.
    Returns the tensors that exist before a measurement (parameters, gradients, buffers)."""
    params = [p for p in model.parameters() if p.requires_grad]
    grads: list[torch.Tensor] = []
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        grads.append(p.grad)
    return [*params, *grads, *model.buffers()]


def measure_activations(
    model: nn.Module,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    autocast: AbstractContextManager[Any] | None = None,
) -> ActivationBytes:
    """One forward and backward of one micro-batch with its activation bytes tracked.
    The gradients are added into the model's .grad."""
    existing = _preallocate_grads(model)
    tracker = ActivationTracker([*existing, inputs, targets])
    with tracker:
        loss = _forward_loss(model, inputs, targets, autocast)
        saved = tracker.live_bytes
        loss.backward()
        del loss
    return ActivationBytes(saved, tracker.peak_bytes)


def count_flops(
    model: nn.Module,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    autocast: AbstractContextManager[Any] | None = None,
) -> int:
    """Forward + backward FLOPs of one micro-batch (matmuls and attention), recompute included.
    The gradients are added into the model's .grad."""
    _preallocate_grads(model)
    with flop_counter() as counter:
        _forward_loss(model, inputs, targets, autocast).backward()
    return int(counter.get_total_flops())


@dataclass(frozen=True)
class MicroBatchCost:
    activation_bytes: int
    activation_peak_bytes: int
    flops: int


def measure_micro_batch(
    model: nn.Module,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    autocast: AbstractContextManager[Any] | None = None,
) -> MicroBatchCost:
    """Bytes and FLOPs of one micro-batch: two forward/backward passes."""
    measured = measure_activations(model, inputs, targets, autocast)
    return MicroBatchCost(
        measured.saved, measured.peak, count_flops(model, inputs, targets, autocast)
    )


def _autocast(cfg: RootConfig, device: torch.device) -> AbstractContextManager[Any]:
    return precision_autocast(cfg.train.precision, device)


def _device_of(model: nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def activation_report(
    cfg: RootConfig, model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor
) -> dict[str, Any]:
    """Figures for summary.json, for one micro-batch under the run's policy: activation_bytes,
    activation_peak_bytes, recompute_flops_ratio, and on a GPU activation_cuda_peak_bytes
    (torch.cuda.max_memory_allocated over the same forward and backward, less what was
    allocated before it).

    Measured on a fresh replica of the model (same config, policy and device), so the trained
    model, the engine's hooks and collectives, the optimizer and the RNG streams are untouched.
    Three forward/backward passes of one micro-batch: bytes, FLOPs, FLOPs without recompute.
    """
    device = _device_of(model)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        with torch.device(device):
            replica = build_model(cfg.model)
            if cfg.adapter.enabled:  # the same adapters: no weight gradient for the base
                apply_adapter(replica, cfg.adapter)
        replica.train()
        blocks = blocks_path(cfg.model)
        apply_recompute(replica, cfg.ac, blocks)
        _preallocate_grads(replica)
        report: dict[str, Any] = {}
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            before = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
        measured = measure_activations(replica, inputs, targets, _autocast(cfg, device))
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            report["activation_cuda_peak_bytes"] = int(
                torch.cuda.max_memory_allocated(device) - before
            )
        flops = count_flops(replica, inputs, targets, _autocast(cfg, device))
        flops_none = flops
        if cfg.ac.policy != AcPolicy.none:
            apply_recompute(replica, AcConfig(policy=AcPolicy.none), blocks)
            flops_none = count_flops(replica, inputs, targets, _autocast(cfg, device))
    report.update(
        activation_bytes=measured.saved,
        activation_peak_bytes=measured.peak,
        recompute_flops_ratio=flops / flops_none if flops_none else 1.0,
    )
    return report
