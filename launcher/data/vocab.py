"""The model's vocabulary follows the tokenizer when the user gave a tokenizer and no vocabulary.

With data=hf, `model.vocab_size` unset or `auto` becomes the tokenizer's vocabulary, before any
data is checked or any process starts, for the built-in GPT (`model.vocab_size` defaults to auto)
and for model=hf from a config (random weights: its config's vocab_size is replaced); a user
model whose section says `vocab_size: auto` gets it too. Without a tokenizer, auto is the bytes'
256. config.yaml then holds the number the ranks build; the plan says where it came from.
"""

from __future__ import annotations

from dataclasses import replace

from launcher.config.data import DataConfig, DataKind
from launcher.config.model import AUTO, BYTE_VOCAB, HF_TARGET, ModelConfig, UserModelConfig
from launcher.config.root import RootConfig


def tokenizer_vocab(cfg: DataConfig) -> int | None:
    """The vocabulary of data.tokenizer (data=hf), else None (no tokenizer: bytes or token ids)."""
    if cfg.name != DataKind.hf or not cfg.tokenizer:
        return None
    from launcher.data.tokenizer import load_tokenizer  # the hf extra, only for data=hf

    return load_tokenizer(cfg.tokenizer, cfg.eos_token).vocab_size


def _follows(model: UserModelConfig, tokenizer: int | None) -> bool:
    """A user model whose vocabulary is auto: said so, or model=hf from a config without one."""
    wanted = model.kwargs.get("vocab_size", None)
    if wanted == AUTO:
        return True
    from_config = model._target_ == HF_TARGET and bool(model.kwargs.get("config"))
    return wanted is None and from_config and tokenizer is not None


def follow_tokenizer(cfg: RootConfig) -> RootConfig:
    """cfg with model.vocab_size=auto (or unset, see the module) resolved to a number."""
    model = cfg.model
    if isinstance(model, ModelConfig):
        if model.vocab_size != AUTO:
            return cfg
        size = tokenizer_vocab(cfg.data) or BYTE_VOCAB
        return replace(cfg, model=replace(model, vocab_size=size))
    if "vocab_size" in model.kwargs and model.kwargs["vocab_size"] != AUTO:
        return cfg  # the user's number (checked against the data like any other)
    tokenizer = tokenizer_vocab(cfg.data)
    if not _follows(model, tokenizer):
        return cfg
    kwargs = {**model.kwargs, "vocab_size": tokenizer or BYTE_VOCAB}
    return replace(cfg, model=replace(model, kwargs=kwargs))


def vocab_source(cfg: RootConfig, vocab: int | None) -> str | None:
    """Where the model's vocabulary of `vocab` tokens comes from, in the plan's words."""
    if vocab is None:
        return None
    if tokenizer_vocab(cfg.data) == vocab:
        return "data.tokenizer"
    return "model.vocab_size" if isinstance(cfg.model, ModelConfig) else "model"
