"""Activation bytes of one micro-batch, measured by a probe forward and backward of the real model
under fake tensors (`torch._subclasses.fake_tensor.FakeTensorMode`): every op runs for its shapes
only, so a 1B-parameter model costs no memory and well under a second per pass (plus torch's
one-off import of its compiler stack, about 2 s, on the first fake op of a process).

The probe runs the model the launcher builds (built-in GPT, a `_target_` model, a transformers
model) with the run's recompute policy applied, and counts live storages with the same tracker
the runs use (launcher/recompute/measure.py). Micro sizes 2 and 3 give a line
`fixed + per_sequence x micro_size`, so any micro size is planned without another probe; one
sequence is probed on its own (some kernels take another path for it, and the peak moves). A model
that fake tensors cannot run is probed for real on the CPU with one, two and three sequences and
scaled the same way (it costs that model's memory once). A transformers model is built on the meta
device and moved to fake storage: its constructor cannot run on fake tensors.
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext, suppress
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from launcher.adapters.apply import apply_adapter
from launcher.config.ac import AcConfig, AcPolicy
from launcher.config.model import blocks_path
from launcher.config.root import RootConfig
from launcher.engines import engine_spec
from launcher.engines.precision import autocast, dtype
from launcher.logs import get_logger
from launcher.memory import probe_cache
from launcher.models.build import build_model
from launcher.models.output import logits_of
from launcher.recompute.measure import ActivationTracker, _preallocate_grads
from launcher.recompute.policies import apply_recompute
from launcher.training.loss import token_loss_sum

PROBE_SIZES = (2, 3)
"""Micro sizes probed; activations from 2 sequences on are a line through them."""


@dataclass(frozen=True)
class ActivationLine:
    """Activation bytes of one micro-batch as `fixed + per_sequence x micro_size`."""

    saved_fixed: int
    saved_per_sequence: int
    peak_fixed: int
    peak_per_sequence: int
    method: str
    """"fake tensors" or "real CPU probe, scaled"."""
    one: tuple[int, int] = (0, 0)
    """(saved, peak) measured for one sequence."""

    def saved(self, micro_size: int) -> int:
        if micro_size == 1:
            return self.one[0]
        return max(0, self.saved_fixed + self.saved_per_sequence * micro_size)

    def peak(self, micro_size: int) -> int:
        if micro_size == 1:
            return self.one[1]
        return max(0, self.peak_fixed + self.peak_per_sequence * micro_size)


def _model_dtype_cast(cfg: RootConfig) -> bool:
    """Whether the engine holds the model itself in 16 bits (no autocast)."""
    return engine_spec(cfg.engine.name).casts_model(cfg)


def _one_probe(cfg: RootConfig, model: nn.Module, micro_size: int) -> tuple[int, int]:
    """(saved, peak) activation bytes of one forward and backward of `micro_size` sequences."""
    inputs = torch.zeros((micro_size, cfg.model.seq_len), dtype=torch.long)
    existing = [*_preallocate_grads(model), inputs]
    cast = _model_dtype_cast(cfg)
    mixed = nullcontext() if cast else autocast(cfg.train.precision, torch.device("cpu"))
    tracker = ActivationTracker(existing)
    with tracker:
        loss = _loss(model, inputs, mixed)
        saved = tracker.live_bytes
        loss.backward()
        del loss
    return saved, tracker.peak_bytes


def _loss(model: nn.Module, inputs: torch.Tensor, mixed: Any) -> torch.Tensor:
    # A function of its own so that the logits are released when it returns, as in training.
    with mixed:
        logits = logits_of(model(inputs))
    assert logits is not None
    targets = torch.zeros(logits.shape[:-1], dtype=torch.long)
    return token_loss_sum(logits, targets)


def _line(
    cfg: RootConfig, model: nn.Module, policies: list[AcPolicy], method: str
) -> dict[AcPolicy, ActivationLine]:
    lines: dict[AcPolicy, ActivationLine] = {}
    blocks = blocks_path(cfg.model)
    for policy in policies:
        apply_recompute(model, AcConfig(policy=policy, every_n=cfg.ac.every_n), blocks)
        one = _one_probe(cfg, model, 1)
        (s2, p2), (s3, p3) = (_one_probe(cfg, model, m) for m in PROBE_SIZES)
        lines[policy] = ActivationLine(
            3 * s2 - 2 * s3, s3 - s2, 3 * p2 - 2 * p3, p3 - p2, method, one
        )
    return lines


@contextmanager
def _quiet() -> Iterator[None]:
    recompute = get_logger("recompute")  # the probe's policies are not the run's: not announced
    level = recompute.level
    recompute.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings():
            # The selective policy compares storages by data pointer; fake storages have one.
            warnings.filterwarnings("ignore", message=".*data pointer of FakeTensor.*")
            warnings.filterwarnings("ignore", message=".*TypedStorage is deprecated.*")
            yield
    finally:
        recompute.setLevel(level)


def probe_activations(cfg: RootConfig, policies: list[AcPolicy]) -> dict[AcPolicy, ActivationLine]:
    """One ActivationLine per policy for the configured model, precision and engine; from the
    disk cache (launcher/memory/probe_cache.py) when this model was probed before."""
    cast = _model_dtype_cast(cfg)
    keys = {policy: probe_cache.probe_key(cfg, policy.value, cast) for policy in policies}
    lines: dict[AcPolicy, ActivationLine] = {}
    for policy, key in keys.items():
        cached = probe_cache.load(key)
        if cached is not None:
            with suppress(TypeError, KeyError):  # an entry of another shape: probe again
                lines[policy] = ActivationLine(**{**cached, "one": tuple(cached["one"])})
    missing = [policy for policy in policies if policy not in lines]
    if missing:
        probed = _probe(cfg, missing)
        for policy, line in probed.items():
            probe_cache.store(keys[policy], dataclasses.asdict(line))
        lines.update(probed)
    return lines


def _probe(cfg: RootConfig, policies: list[AcPolicy]) -> dict[AcPolicy, ActivationLine]:
    """On fake tensors (the model built under FakeTensorMode, or built on the meta device and
    moved to fake storage when its constructor cannot run fake), else by a real CPU probe."""
    from torch._subclasses.fake_tensor import FakeTensorMode  # sets up the fake machinery

    with _quiet(), torch.random.fork_rng(devices=[]):
        try:
            with FakeTensorMode(allow_non_fake_inputs=True):
                return _line(cfg, _build(cfg), policies, "fake tensors")
        except Exception:  # an op without a fake kernel, a constructor that needs real data
            pass
        try:
            from launcher.models.probe import _on

            with _on("meta"):
                meta = _build(cfg)
            with FakeTensorMode(allow_non_fake_inputs=True):
                model = meta.to_empty(device="cpu")  # fake storage: no memory
                return _line(cfg, model, policies, "fake tensors")
        except Exception:
            return _line(cfg, _build(cfg), policies, "real CPU probe, scaled")


def _build(cfg: RootConfig) -> nn.Module:
    model = build_model(cfg.model)
    if cfg.adapter.enabled:  # the adapters' activations too, and no gradient for the base
        apply_adapter(model, cfg.adapter)
    if _model_dtype_cast(cfg):
        model = model.to(dtype(cfg.train.precision))
    model.train()
    return model
