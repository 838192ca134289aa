"""The model, checked before any rank trains (`launch plan` and `launch train` run this while
planning): built on the meta device (no memory, no weights read), its block list found where a
recompute policy or FSDP needs one, and, for a user's model, one probe forward that must return
logits whose vocabulary covers every target id of the first samples. Each refusal is a
ConfigError naming the key and the fix (exit status 2)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from launcher.adapters.targets import count_parameters, resolve
from launcher.config.ac import AcPolicy
from launcher.config.model import UserModelConfig, blocks_path
from launcher.config.root import RootConfig
from launcher.errors import ConfigError, DataError, LauncherError, VocabTooSmall
from launcher.models.blocks import BlockList, find_blocks, require_blocks
from launcher.models.build import build_model
from launcher.models.init_from import check_initial_weights
from launcher.models.probe_forward import _on, check_output, probe_output
from launcher.models.tensor_parallel import check_family_plan
from launcher.models.tp_plan import TpShare, check_plan, rank_share
from launcher.models.tp_probe import check_one_rank
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
    tp_share: TpShare | None = None
    """One tensor-parallel rank's parameters under model.tp_plan (None: counted by the family's
    rule, launcher/parallel/shape.py)."""


def _needs_blocks(cfg: RootConfig, engine: str | None) -> str | None:
    needs = []
    if cfg.ac.policy not in (AcPolicy.none, AcPolicy.auto):  # auto picks none without blocks
        needs.append(f"ac={cfg.ac.policy.value}")
    if engine:
        needs.append(engine)
    return " and ".join(needs) or None


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
    tp, share = cfg.parallel.tp, None
    own_plan = isinstance(cfg.model, UserModelConfig) and bool(cfg.model.tp_plan)
    if tp > 1 and isinstance(cfg.model, UserModelConfig) and not own_plan:
        check_family_plan(model, tp)
    if tp > 1 and isinstance(cfg.model, UserModelConfig) and own_plan:
        planned = check_plan(model, cfg.model.tp_plan or {}, tp)
        share = rank_share(model, planned, tp, blocks.blocks[0] if blocks else None)
    vocab = None
    if isinstance(cfg.model, UserModelConfig):
        with _on("meta"):
            output, device = probe_output(cfg.model, model)
        vocab = check_output(cfg.model, output)
        check_vocab(cfg, cfg.model, vocab)
        if share is not None:
            check_one_rank(cfg.model, tp, vocab, device)
    block = sum(p.numel() for p in blocks.blocks[0].parameters()) if blocks else 0
    sizes = tuple(p.numel() for p in model.parameters())
    if not cfg.adapter.enabled:  # (adapters are refused under tensor parallelism)
        largest = max(sizes, default=0)
        return ModelInfo(parameters, blocks, vocab, block, largest, sizes, tp_share=share)
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
