"""The measured peak tensor memory of a rank over its first optimizer steps, compared with the plan.

CUDA: `torch.cuda.max_memory_allocated` over the window. CPU: the bytes of every live tensor
storage the run made when the window opens (found through the garbage collector, plus DDP's
gradient buckets, which only C++ holds) and the peak of what ops create inside it (a
TorchDispatchMode with weak references, launcher/recompute/measure.py), so the figure is tensor
memory, not the RSS. Objects alive before the rank joined its group are set aside from the
collector (launcher/distributed.py) and not counted: not the run's (an earlier in-process sweep
point's leftovers, say), where CUDA's allocator figure would include them.

The window is the first two steps of the process (one when it runs one): the first creates the
optimizer state, so the second is the first at the steady state the plan describes. Later steps
run untouched.
"""

from __future__ import annotations

import gc
import json
import re
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from launcher.logs import get_logger
from launcher.recompute.measure import ActivationTracker
from launcher.rundir import PLAN_FILE

log = get_logger("memory")

WINDOW_STEPS = 2
DRIFT_WARNING = 0.15
"""A plan more than this fraction off the measured peak logs a warning."""


def _plain_tensors(value: Any) -> list[torch.Tensor]:
    """The tensors that own storage: a subclass (DTensor) is unwrapped to its inner tensors."""
    if not isinstance(value, torch.Tensor) or value.is_meta:
        return []
    if type(value) in (torch.Tensor, nn.Parameter):
        return [value]
    flatten = getattr(value, "__tensor_flatten__", None)
    if flatten is None:
        return []
    names, _ = flatten()
    return [t for name in names for t in _plain_tensors(getattr(value, name))]


class _StepTracker(ActivationTracker):
    """ActivationTracker that also follows subclass outputs (FSDP2's DTensors) to their storage."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            for tensor in _plain_tensors(leaf):
                self._track(tensor.untyped_storage())
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        return out


def live_cpu_tensors() -> list[torch.Tensor]:
    """Every CPU tensor object alive in this process (parameters, gradients, optimizer state,
    engine buffers held from Python)."""
    with warnings.catch_warnings():  # isinstance on deprecated torch objects warns
        warnings.simplefilter("ignore")
        objects = [obj for obj in gc.get_objects() if isinstance(obj, torch.Tensor)]
    return [t for obj in objects for t in _plain_tensors(obj) if t.device.type == "cpu"]


def storage_bytes(tensors: list[torch.Tensor]) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        storage = t.untyped_storage()
        seen[id(storage)] = storage.nbytes()
    return sum(seen.values())


def ddp_bucket_bytes(model: nn.Module) -> int:
    """DDP's gradient buckets (a copy of every gradient, held by its C++ reducer)."""
    if not isinstance(model, nn.parallel.DistributedDataParallel):
        return 0
    sizes = str(model._get_ddp_logging_data().get("bucket_sizes", ""))
    return sum(int(n) for n in re.findall(r"\d+", sizes))


class PeakMeter:
    """A step callback: opens the window before the first step it sees, closes it after
    WINDOW_STEPS (or at `close`); `peak_bytes` is None until then."""

    def __init__(
        self,
        device: torch.device,
        model: nn.Module,
        steps: int,
        planned: int | None = None,
        announce: bool = False,
    ) -> None:
        self.device, self.model = device, model
        self.planned, self.announce = planned, announce
        self.window = min(WINDOW_STEPS, steps)
        self.first: int | None = None
        self.peak_bytes: int | None = None
        self._tracker: _StepTracker | None = None
        self._baseline = 0
        self.steps_seen = 0

    def before_step(self, step: int) -> None:
        if self.first is not None:
            return
        self.first = step
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        gc.collect()
        existing = live_cpu_tensors()
        self._baseline = storage_bytes(existing) + ddp_bucket_bytes(self.model)
        self._tracker = _StepTracker(existing)
        self._tracker.__enter__()

    def after_step(self, step: int) -> None:
        if self.first is not None:
            self.steps_seen = step - self.first + 1
            if self.steps_seen >= self.window:
                self.close()

    def close(self) -> None:
        """End the window early (the run stopped); safe to call twice."""
        if self.first is None or self.peak_bytes is not None:
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak_bytes = int(torch.cuda.max_memory_allocated(self.device))
        else:
            assert self._tracker is not None
            self._tracker.__exit__(None, None, None)
            self.peak_bytes = self._baseline + self._tracker.peak_bytes
            self._tracker = None
        if self.announce:
            check_drift(self.planned, self.peak_bytes, steady=self.steps_seen >= 2)


def planned_peak_bytes(run_dir: Path) -> int | None:
    """The plan's per-rank peak from the run directory's plan.json (None: not planned here)."""
    try:
        value = json.loads((run_dir / PLAN_FILE).read_text(encoding="utf-8"))["planned_peak_bytes"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return int(value) if isinstance(value, int) else None


def check_drift(planned: int | None, measured: int | None, steady: bool = True) -> float | None:
    """measured / planned - 1, with a warning when it is more than DRIFT_WARNING off. A run of
    one step (not `steady`) has no optimizer state yet at its activation peak, so only a
    measurement above the plan warns then."""
    if not planned or measured is None:
        return None
    drift = measured / planned - 1
    if drift > DRIFT_WARNING or (steady and drift < -DRIFT_WARNING):
        log.warning(
            f"the memory plan was {drift:+.0%} off: planned peak {planned / 2**20:,.1f} MiB per "
            f"rank, measured {measured / 2**20:,.1f} MiB over the first steps. The budget checks "
            "use the plan; see docs/memory.md."
        )
    return drift
