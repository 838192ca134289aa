"""The model, checked before any rank trains (`launch plan` and `launch train` run this while
planning): built on the meta device (no memory, no weights read), its block list found where a
recompute policy or FSDP needs one, and, for a user's model, one probe forward that must return
logits whose vocabulary covers every target id of the first samples. Each refusal is a
ConfigError naming the key and the fix (exit status 2)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from launcher.adapters.targets import count_parameters, resolve
from launcher.config.ac import AcPolicy
from launcher.config.model import UserModelConfig, blocks_path
from launcher.config.root import RootConfig
from launcher.errors import ConfigError, DataError, LauncherError, VocabTooSmall
from launcher.models.blocks import BlockList, find_blocks, require_blocks
from launcher.models.build import build_model
from launcher.models.init_from import check_initial_weights
from launcher.models.output import LogitsForward
from launcher.models.tensor_parallel import check_family_plan
from launcher.models.vocab import vocab_fix

PROBE_SAMPLES = 32
"""Samples whose target ids are compared with the logits' vocabulary."""


@dataclass(frozen=True)
class ModelInfo:
    parameters: int
    blocks: BlockList | None
    vocab: int | None
    """The logits' last dimension (a user model's, from the probe); None when not probed."""
    block_parameters: int = 0
    """Parameters of one repeated block (0: no blocks found): FSDP's unit, gathered at once."""
    largest_parameter: int = 0
    """Elements of the largest parameter (the optimizer's per-tensor temporaries)."""
    parameter_sizes: tuple[int, ...] = ()
    """Elements of each parameter (ZeRO-3 keeps the small ones whole)."""
    trainable: int | None = None
    """Parameters that train (adapter=lora: the adapters and train_modules); None: all."""
    block_trainable: int | None = None
    """The same for one repeated block."""


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


def _needs_blocks(cfg: RootConfig, engine: str | None) -> str | None:
    needs = []
    if cfg.ac.policy not in (AcPolicy.none, AcPolicy.auto):  # auto picks none without blocks
        needs.append(f"ac={cfg.ac.policy.value}")
    if engine:
        needs.append(engine)
    return " and ".join(needs) or None


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


def probe_vocab(cfg: UserModelConfig, meta_model: nn.Module) -> int:
    """One forward on the meta device; on a model the meta device cannot run, one CPU sample."""
    try:
        output = _probe_logits(meta_model, cfg.seq_len, "meta")
    except (NotImplementedError, RuntimeError):
        with _on("cpu"):
            output = _probe_logits(build_model(cfg), cfg.seq_len, "cpu")
    return check_output(cfg, output)


def max_target_id(cfg: RootConfig, model: UserModelConfig, vocab: int) -> int | None:
    """The largest target id of the first samples of the configured data (None: none read).
    A token file is checked whole by the data's own builder, given the vocabulary."""
    from launcher.data import build_dataset

    try:
        dataset: Any = build_dataset(cfg.data, cfg.model.seq_len, cfg.train.seed, vocab)
        count = len(dataset) or PROBE_SAMPLES  # 0: an unbounded source (sample i from the seed)
        samples = [dataset[i] for i in range(min(count, PROBE_SAMPLES))]
    except VocabTooSmall as exc:  # said in this model's words
        raise DataError(
            f"{exc.problem} Fix: {vocab_fix(model, exc.needed, exc.tokenizer)}, or "
            f"{exc.alternative}"
        ) from None
    except LauncherError:
        raise
    except Exception:  # the data's own checks report a bad data source in their words
        return None
    ids = [int(t.max()) for t in map(_targets, samples) if t is not None and t.numel()]
    return max(ids, default=None)


def _targets(sample: Any) -> torch.Tensor | None:
    found = sample.get("labels") if isinstance(sample, dict) else getattr(sample, "targets", None)
    return None if found is None else torch.as_tensor(found)


def check_vocab(cfg: RootConfig, model: UserModelConfig, vocab: int) -> None:
    top = max_target_id(cfg, model, vocab)
    if top is not None and top >= vocab:
        raise ConfigError(
            "model",
            f"the model's logits have {vocab} entries, but the data has target id {top}.",
            f"{vocab_fix(model, top + 1)}, or use data that matches the model.",
        )


def inspect_model(cfg: RootConfig, engine_needs: str | None) -> ModelInfo:
    """Build, count, find blocks and probe: every model check the plan makes. `engine_needs`: why
    the engine needs the model's blocks, or None (`EngineSpec.needs_blocks`: the engines sit
    above the models, so the plan asks them)."""
    with _on("meta"):
        model = build_model(cfg.model)
    parameters = sum(p.numel() for p in model.parameters())
    path, needs = blocks_path(cfg.model), _needs_blocks(cfg, engine_needs)
    blocks = require_blocks(model, path, needs) if needs else find_blocks(model, path)
    if cfg.model.init_from:
        check_initial_weights(model, cfg.model.init_from)
    if cfg.parallel.tp > 1 and isinstance(cfg.model, UserModelConfig):
        check_family_plan(model, cfg.parallel.tp)
    vocab = None
    if isinstance(cfg.model, UserModelConfig):
        with _on("meta"):
            vocab = probe_vocab(cfg.model, model)
        check_vocab(cfg, cfg.model, vocab)
    block = sum(p.numel() for p in blocks.blocks[0].parameters()) if blocks else 0
    sizes = tuple(p.numel() for p in model.parameters())
    if not cfg.adapter.enabled:
        return ModelInfo(parameters, blocks, vocab, block, max(sizes, default=0), sizes)
    # adapter.targets / train_modules / rank checked against the model's layers, and counted.
    first = blocks.blocks[0] if blocks else None
    counts = count_parameters(model, resolve(model, cfg.adapter), cfg.adapter.rank, first)
    sizes += counts.sizes
    return ModelInfo(
        parameters + counts.added,
        blocks,
        vocab,
        block + counts.block_added,
        max(sizes, default=0),
        sizes,
        trainable=counts.trainable,
        block_trainable=counts.block_trainable,
    )
