"""Flat binary token files (nanoGPT's and Megatron-style `.bin`), memory-mapped, never read whole.

A file of N tokens gives ceil((N - 1) / seq_len) windows: window i holds tokens
i*seq_len .. i*seq_len + seq_len (seq_len + 1 of them); inputs are the first seq_len, targets the
last seq_len (the next token of each input). The last window is padded with target -100. An
optional mask file (one uint8 per token, 0 = never a target) carries fine-tuning prompts through
the same windows (launcher/data/hf.py writes one).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from launcher.data.notes import PackingFacts
from launcher.data.sequence import IGNORE_INDEX, PAD_ID, Sample
from launcher.errors import DataError, VocabTooSmall
from launcher.integrity.token_scan import max_token_id


def check_file(key: str, path: Path, fix: str = "") -> Path:
    """An existing regular file, or a DataError naming the key and the file."""
    if not path.exists():
        raise DataError(
            f"{key}: no such file: {path}. Fix: {fix or f'point {key} at an existing file.'}"
        )
    if not path.is_file():
        raise DataError(f"{key}: {path} is not a file. Fix: point {key} at a file.")
    return path


def open_tokens(key: str, path: Path, dtype: str) -> np.memmap:
    """Memory-map a token file; its size must be a whole number of `dtype` tokens."""
    check_file(key, path)
    size, itemsize = path.stat().st_size, np.dtype(dtype).itemsize
    if size % itemsize:
        other = "uint32" if dtype == "uint16" else "uint16"
        fix = "rewrite the file as a flat array of one dtype."
        if size % np.dtype(other).itemsize == 0:  # an odd size fits no dtype: no dtype to offer
            fix = f"set data.dtype={other} if it was written that way, or {fix}"
        raise DataError(
            f"{key}: {path} is {size:,} bytes, not a multiple of {itemsize} ({dtype} tokens): "
            f"it is not a {dtype} token file (cut short, or of another format). Fix: {fix}"
        )
    if size < 2 * itemsize:
        raise DataError(f"{key}: {path} holds fewer than 2 tokens. Fix: use a longer file.")
    return np.memmap(path, dtype=dtype, mode="r")


def check_vocab(key: str, path: Path, dtype: str, vocab_size: int) -> None:
    """Refuse ids at or past `vocab_size`; the file is read whole once per identity."""
    top, index = max_token_id(path, dtype)
    if top >= vocab_size:
        raise VocabTooSmall(
            f"{key}: {path} holds token id {top} (token {index:,}), past the model's vocabulary "
            f"of {vocab_size}.",
            top + 1,
            f"check that the file holds {dtype} ids (data.dtype) of the model's tokenizer.",
        )


class PackedTokens:
    """Windows of seq_len + 1 tokens over a flat (memory-mapped) token array."""

    packing: PackingFacts | None = None
    """Records concatenated into these windows (a tokenized cache's): how many, and the fill."""

    def __init__(
        self, tokens: np.ndarray, seq_len: int, mask: np.ndarray | None = None, pad_id: int = PAD_ID
    ) -> None:
        self.tokens, self.mask, self.seq_len, self.pad_id = tokens, mask, seq_len, pad_id

    def __len__(self) -> int:
        return max(1, -(-(len(self.tokens) - 1) // self.seq_len))

    def __getitem__(self, index: int) -> Sample:
        if not 0 <= index < len(self):
            raise IndexError(index)
        start = index * self.seq_len
        end = start + self.seq_len + 1
        chunk = torch.from_numpy(np.asarray(self.tokens[start:end], dtype=np.int64))
        n = len(chunk) - 1
        inputs = torch.full((self.seq_len,), self.pad_id, dtype=torch.long)
        targets = torch.full((self.seq_len,), IGNORE_INDEX, dtype=torch.long)
        inputs[:n], targets[:n] = chunk[:-1], chunk[1:]
        if self.mask is not None:
            trained = torch.from_numpy(np.asarray(self.mask[start + 1 : end], dtype=np.bool_))
            targets[:n][~trained] = IGNORE_INDEX
        return Sample(inputs, targets)

    def eval_problems(self) -> list[tuple[bytes, bytes]]:
        return []


def token_file(key: str, path: str, dtype: str, seq_len: int) -> PackedTokens:
    tokens = open_tokens(key, Path(path), dtype)
    if len(tokens) < seq_len + 1:
        # One padded window repeated for every sample would train on almost nothing, silently.
        raise DataError(
            f"{key}: {path} holds {len(tokens):,} tokens, fewer than one window of "
            f"model.seq_len + 1 = {seq_len + 1}. Fix: use more data, or a smaller model.seq_len."
        )
    return PackedTokens(tokens, seq_len)
