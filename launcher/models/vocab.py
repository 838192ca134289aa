"""The fix for a vocabulary too small for the data, in the words of each kind of model: the
override that exists for it, exactly as it is typed."""

from __future__ import annotations

from pathlib import Path

from launcher.config.model import HF_TARGET, UserModelConfig
from launcher.models.user import _accepts, locate_target


def vocab_fix(cfg: UserModelConfig, needed: int, tokenizer: bool = False) -> str:
    """How to give this user model `needed` logits (or the data fewer ids). tokenizer: the data
    has one, which model.vocab_size=auto follows. A vocab_size the section already has (from its
    YAML or a +model.vocab_size on the command line) is set with ++, which works either way."""
    auto = " (or auto: the tokenizer's)" if tokenizer else ""
    key = "model.vocab_size"
    if cfg._target_ == HF_TARGET:
        if cfg.kwargs.get("config"):  # random weights: the config's vocab_size is overridable
            if "vocab_size" in cfg.kwargs:
                return f"set ++{key}={needed}{auto}"
            return f"add +{key}={needed} (it overrides the config's vocab_size)"
        path = Path(str(cfg.kwargs.get("path")))
        if (path / "tokenizer.json").is_file() or (path / "tokenizer_config.json").is_file():
            return f"use the checkpoint's own tokenizer: data.tokenizer={path}"
        return "use the tokenizer the checkpoint was trained with (data.tokenizer=DIR)"
    if "vocab_size" in cfg.kwargs:
        return f"set ++{key}={needed}{auto}"
    if _accepts(locate_target(cfg._target_), "vocab_size"):
        return f"add +{key}={needed}"
    return f"give {cfg._target_} an output layer of at least {needed} logits"
