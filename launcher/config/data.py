"""Which dataset to train on."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from launcher.config.checks import require_positive
from launcher.errors import ConfigError


class DataKind(str, Enum):
    reverse = "reverse"
    text = "text"
    jsonl = "jsonl"


@dataclass
class DataConfig:
    """`reverse` is built in (no file); `text` and `jsonl` read data.path."""

    name: DataKind = DataKind.reverse
    """reverse: the built-in task; text: any UTF-8 file as bytes; jsonl: prompt/completion pairs."""
    path: str | None = None
    """File for text and jsonl (ignored by reverse)."""
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
        if self.max_len < self.min_len:
            raise ConfigError(
                ["data.min_len", "data.max_len"], "max_len is below min_len.", "raise data.max_len."
            )
        if self.name in (DataKind.text, DataKind.jsonl) and not self.path:
            raise ConfigError(
                "data.path",
                f"data={self.name.value} needs a file.",
                f"add data.path=/path/to/file (a UTF-8 {'text' if self.name == DataKind.text else 'JSON Lines'} file).",
            )
        if not self.alphabet or any(ord(c) > 127 or c in "|." for c in self.alphabet):
            raise ConfigError(
                "data.alphabet",
                "must be ASCII characters other than '|' and '.'.",
            )
