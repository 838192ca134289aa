"""Which dataset to train on (and validate on)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from launcher.config.checks import require_positive
from launcher.errors import ConfigError


class DataKind(str, Enum):
    reverse = "reverse"
    text = "text"
    jsonl = "jsonl"
    tokens = "tokens"
    hf = "hf"
    custom = "custom"


class TokenDtype(str, Enum):
    uint16 = "uint16"
    uint32 = "uint32"


NEEDS_PATH = {
    DataKind.text: "a UTF-8 text file",
    DataKind.jsonl: "a JSON Lines file",
    DataKind.tokens: "a flat binary token file (.bin)",
    DataKind.hf: "a parquet, json/jsonl, arrow or csv file, or a saved dataset directory",
}


@dataclass
class DataConfig:
    """`reverse` is built in (no file); `text`, `jsonl`, `tokens` and `hf` read data.path;
    `custom` builds any map-style dataset named by data._target_."""

    name: DataKind = DataKind.reverse
    """reverse | text | jsonl | tokens (flat binary token file) | hf (datasets + tokenizer) |
    custom."""
    path: str | None = None
    """The training data (text, jsonl, tokens, hf; ignored by reverse and custom)."""
    val_path: str | None = None
    """tokens, hf, text: held-out data for the validation loss (eval.every), same format as path."""
    dtype: TokenDtype = TokenDtype.uint16
    """tokens: uint16 (vocabularies up to 65,536, nanoGPT's format) or uint32."""
    tokenizer: str | None = None
    """hf: a local tokenizer directory (tokenizer.json, or anything AutoTokenizer loads)."""
    text_field: str = "text"
    """hf pretraining: the field holding each document (concatenated with EOS and packed)."""
    prompt_field: str | None = None
    """hf fine-tuning: the prompt field (its tokens are masked with -100); set with
    completion_field."""
    completion_field: str | None = None
    """hf fine-tuning: the completion field (the tokens that are trained on)."""
    packing: bool = False
    """hf fine-tuning: pack pairs into full windows (true) or pad one pair per sequence (false)."""
    split: str = "train"
    """hf: the split of a saved DatasetDict (or of a dataset directory) to read."""
    eos_token: str | None = None
    """hf: the end-of-sequence token; default the tokenizer's own (or </s>, <|endoftext|>,
    <eos>)."""
    cache_dir: str | None = None
    """hf: where tokenized data is cached (default $LAUNCHER_CACHE or ~/.cache/launcher/data)."""
    tokenize_workers: int | None = None
    """hf: processes that tokenize into the cache (null: the available cores; 1: this process
    alone). The cache is the same whatever the number."""
    holdout: int = 0
    """text, tokens, hf, custom without val_path: the last N samples are held out for validation."""
    _target_: str | None = None
    """custom: pkg.mod.callable returning a map-style dataset of {"input_ids", "labels"}."""
    args: dict[str, Any] = field(default_factory=dict)
    """custom: keyword arguments for data._target_ (+data.args.NAME=VALUE on the command line)."""
    min_len: int = 2
    """reverse: shortest string to reverse."""
    max_len: int = 8
    """reverse: longest string to reverse."""
    alphabet: str = "abcdefghij"
    """reverse: the characters of the strings."""
    eval_problems: int = 256
    """Held-out problems scored by exact match at the end (reverse, jsonl)."""

    def __post_init__(self) -> None:
        require_positive("data.min_len", self.min_len)
        require_positive("data.max_len", self.max_len)
        require_positive("data.eval_problems", self.eval_problems)
        if self.tokenize_workers is not None and self.tokenize_workers < 1:
            raise ConfigError(
                "data.tokenize_workers",
                f"must be 1 or more, got {self.tokenize_workers}.",
                "set data.tokenize_workers=1 (this process only), a number of processes, or "
                "null (the available cores).",
            )
        if self.holdout < 0:
            raise ConfigError("data.holdout", f"must be 0 or more, got {self.holdout}.")
        if self.max_len < self.min_len:
            raise ConfigError(
                ["data.min_len", "data.max_len"], "max_len is below min_len.", "raise data.max_len."
            )
        if self.name in NEEDS_PATH and not self.path:
            raise ConfigError(
                "data.path",
                f"data={self.name.value} needs a file.",
                f"add data.path=/path/to/file ({NEEDS_PATH[self.name]}).",
            )
        if self.name == DataKind.hf and not self.tokenizer:
            raise ConfigError(
                "data.tokenizer",
                "data=hf needs a tokenizer.",
                "add data.tokenizer=DIR (a local directory with tokenizer.json).",
            )
        if (self.prompt_field is None) != (self.completion_field is None):
            raise ConfigError(
                ["data.prompt_field", "data.completion_field"],
                "fine-tuning needs both fields.",
                "set both (e.g. data.prompt_field=prompt data.completion_field=completion), "
                "or neither for pretraining on data.text_field.",
            )
        if self.name == DataKind.custom and not self._target_:
            raise ConfigError(
                "data._target_",
                "data=custom needs the callable that builds the dataset.",
                "add data._target_=my_project.data.make_dataset.",
            )
        if self.name != DataKind.custom and (self._target_ or self.args):
            key = "data._target_" if self._target_ else "data.args"
            raise ConfigError(
                key, f"only applies to data=custom (data is {self.name.value}).", "add data=custom."
            )
        if not self.alphabet or any(ord(c) > 127 or c in "|." for c in self.alphabet):
            raise ConfigError(
                "data.alphabet",
                "must be ASCII characters other than '|' and '.'.",
            )
