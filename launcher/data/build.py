"""Pick the training and validation datasets named by data.name, and check them before a run."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from launcher.config.data import DataConfig, DataKind
from launcher.config.model import AnyModelConfig, ModelConfig
from launcher.config.root import RootConfig
from launcher.config.sources import absolute
from launcher.data.custom import CustomDataset
from launcher.data.files import JsonlDataset, TextDataset
from launcher.data.heldout import hold_out, problems_as_samples
from launcher.data.mixture import MixtureDataset
from launcher.data.reverse import ReverseDataset
from launcher.data.sequence import TokenDataset
from launcher.data.shards import token_corpus
from launcher.data.vocab import follow_tokenizer
from launcher.errors import DataError


@dataclass
class Datasets:
    train: TokenDataset
    val: TokenDataset | None
    """Held-out sequences for the validation loss (None: the source has none configured)."""


def _train_source(cfg: DataConfig, seq_len: int, seed: int, vocab: int | None) -> TokenDataset:
    if cfg.name == DataKind.reverse:
        return ReverseDataset(cfg, seq_len, seed)
    if cfg.name == DataKind.custom:
        assert cfg._target_ is not None  # DataConfig checks this
        return CustomDataset(cfg._target_, cfg.args)
    if cfg.sources:
        return _mixture(cfg, seq_len, vocab)
    assert cfg.path is not None  # DataConfig checks this
    if cfg.name == DataKind.text:
        return TextDataset(Path(cfg.path), seq_len)
    if cfg.name == DataKind.jsonl:
        return JsonlDataset(Path(cfg.path), seq_len, cfg.held_out_problems)
    return _file_source("data.path", cfg.path, cfg, seq_len, vocab)


def _file_source(
    key: str, path: Any, cfg: DataConfig, seq_len: int, vocab: int | None
) -> TokenDataset:
    if cfg.name == DataKind.tokens:
        return token_corpus(key, path, cfg.dtype.value, seq_len, vocab)
    if cfg.name == DataKind.text:
        return TextDataset(Path(path), seq_len)
    from launcher.data.hf import hf_dataset  # the hf extra, only when data=hf

    return hf_dataset(key, path, cfg, seq_len, vocab)[0]


def _mixture(cfg: DataConfig, seq_len: int, vocab: int | None) -> MixtureDataset:
    """data.sources: each source's data, built as data.path would be with its own fields."""
    datasets = []
    for i, source in enumerate(cfg.sources):
        own = replace(
            cfg,
            sources=[],
            path=source.path,
            dtype=source.dtype or cfg.dtype,
            text_field=source.text_field or cfg.text_field,
        )
        try:
            datasets.append(
                _file_source(f"data.sources[{i}].path", source.path, own, seq_len, vocab)
            )
        except DataError as exc:  # a field the source set itself is named by its own key
            if not (source.text_field and str(exc).startswith("data.text_field:")):
                raise
            own_key = f"data.sources[{i}].text_field"
            raise DataError(str(exc).replace("data.text_field", own_key)) from None
    return MixtureDataset([s.name for s in cfg.sources], [s.weight for s in cfg.sources], datasets)


def build_datasets(
    cfg: DataConfig, seq_len: int, seed: int, vocab_size: int | None = None
) -> Datasets:
    """The training set and its held-out set. vocab_size: refuse token ids at or past it (a full,
    chunked scan of a token file; None skips it)."""
    train = _train_source(cfg, seq_len, seed, vocab_size)
    if cfg.name == DataKind.reverse:
        return Datasets(train, problems_as_samples(train.eval_problems(), seq_len))
    if isinstance(train, JsonlDataset):
        held = problems_as_samples(train.held_out, seq_len) if train.held_out else None
        return Datasets(train, held)
    if cfg.val_path and cfg.name != DataKind.custom:
        return Datasets(
            train, _file_source("data.val_path", cfg.val_path, cfg, seq_len, vocab_size)
        )
    train, val = hold_out(train, cfg.holdout, f"data={cfg.name.value}")
    return Datasets(train, val)


def build_dataset(
    cfg: DataConfig, seq_len: int, seed: int, vocab_size: int | None = None
) -> TokenDataset:
    """The training set alone (what the launcher's checks and older callers read)."""
    return build_datasets(cfg, seq_len, seed, vocab_size).train


def model_vocab(cfg: AnyModelConfig) -> int | None:
    """The built-in GPT's vocabulary (a user model's is found by the plan's probe: None)."""
    return cfg.vocab if isinstance(cfg, ModelConfig) else None


def vocab_of(model: nn.Module) -> int | None:
    """The vocabulary of a built model's output layer, where it can be found (a transformers
    model's output embeddings, or a final nn.Linear named head / lm_head)."""
    get = getattr(model, "get_output_embeddings", None)
    layer = get() if callable(get) else None
    layer = layer or getattr(model, "lm_head", None) or getattr(model, "head", None)
    weight = getattr(layer, "weight", None)
    return int(weight.shape[0]) if isinstance(weight, torch.Tensor) and weight.dim() == 2 else None


def absolute_paths(cfg: DataConfig) -> DataConfig:
    """data.path, val_path, tokenizer, cache_dir and the sources' paths made absolute (the ranks
    may run elsewhere; a glob keeps its pattern, under an absolute directory)."""
    keys = ("path", "val_path", "tokenizer", "cache_dir")
    found = {k: getattr(cfg, k) for k in keys if getattr(cfg, k)}
    made: dict[str, Any] = {k: absolute(v) for k, v in found.items()}
    sources = [replace(s, path=absolute(s.path)) for s in cfg.sources]
    return replace(cfg, **made, sources=sources)


def prepare_data(cfg: RootConfig) -> RootConfig:
    """Before any process starts: paths made absolute, every dataset built once and checked
    (missing files, token files of the wrong size, token ids past model.vocab_size, missing
    fields, tokenizers that are not; data=hf tokenizes into its cache here); model.vocab_size=auto
    resolved (the tokenizer's with data=hf). Raises DataError."""
    cfg = follow_tokenizer(replace(cfg, data=absolute_paths(cfg.data)))  # vocab_size=auto
    build_datasets(cfg.data, cfg.model.seq_len, cfg.train.seed, model_vocab(cfg.model))
    return cfg
