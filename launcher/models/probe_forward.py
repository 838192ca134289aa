"""The probe forward of a user's model, before any rank trains: one sample through the model on
the meta device (no memory, no weights), or on the CPU for a model the meta device cannot run;
its output must be logits (launcher/models/probe.py reads their vocabulary)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from launcher.config.model import UserModelConfig
from launcher.errors import ConfigError
from launcher.models.build import build_model
from launcher.models.output import LogitsForward


class _NoInitOnMeta(TorchFunctionMode):
    """Initialisers and random fills are no-ops on meta tensors (there is no data): skipped,
    they keep torch from importing its compiler for their meta versions (about 2 s of `launch`'s
    start, and seconds more at its exit)."""

    FILLS = frozenset({"normal_", "uniform_", "random_", "bernoulli_", "exponential_", "fill_"})

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        target = args[0] if args else kwargs.get("tensor")
        initialiser = getattr(func, "__module__", None) == "torch.nn.init"
        fill = getattr(func, "__name__", None) in self.FILLS
        if isinstance(target, torch.Tensor) and target.is_meta and (initialiser or fill):
            return target
        return func(*args, **kwargs)


@contextmanager
def _on(device: str) -> Iterator[None]:
    with torch.random.fork_rng(devices=[]), torch.device(device):
        if device != "meta":
            yield
            return
        with _NoInitOnMeta():
            yield


def _probe_logits(model: nn.Module, seq_len: int, device: str) -> Any:
    forward = model.forward
    raw = forward.inner if isinstance(forward, LogitsForward) else forward
    with torch.no_grad():
        return raw(torch.zeros((1, seq_len), dtype=torch.long, device=device))


def _output_error(cfg: UserModelConfig, what: str) -> ConfigError:
    return ConfigError(
        "model._target_",
        f"{cfg._target_}'s forward(input_ids) returned {what}, not logits.",
        "return logits [batch, seq, vocab] (or [batch, classes] for a classifier), or an object "
        "with .logits (a transformers model output).",
    )


def check_output(cfg: UserModelConfig, output: Any) -> int:
    """The logits' vocabulary size; a ConfigError when the output is not logits."""
    from launcher.models.output import logits_of

    logits = logits_of(output)
    if logits is None:
        return _raise(_output_error(cfg, type(output).__name__))
    shape = tuple(logits.shape)
    if not logits.is_floating_point():
        raise _output_error(cfg, f"a {logits.dtype} tensor")
    if (len(shape) == 3 and shape[:2] == (1, cfg.seq_len)) or (len(shape) == 2 and shape[0] == 1):
        return int(shape[-1])
    raise _output_error(cfg, f"a tensor of shape {list(shape)} for input [1, {cfg.seq_len}]")


def _raise(error: ConfigError) -> int:
    raise error


def probe_output(cfg: UserModelConfig, meta_model: nn.Module) -> tuple[Any, str]:
    """One forward on the meta device; on a model the meta device cannot run, one CPU sample.
    (the output, the device it ran on)."""
    try:
        return _probe_logits(meta_model, cfg.seq_len, "meta"), "meta"
    except (NotImplementedError, RuntimeError):
        with _on("cpu"):
            return _probe_logits(build_model(cfg), cfg.seq_len, "cpu"), "cpu"


def probe_vocab(cfg: UserModelConfig, meta_model: nn.Module) -> int:
    return check_output(cfg, probe_output(cfg, meta_model)[0])
