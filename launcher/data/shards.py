"""A token corpus in many files (data.path as a list or a glob): one logical corpus, each shard
memory-mapped on its own and never read whole. Samples do not straddle shards: each shard is cut
into windows of seq_len + 1 tokens as a single file is (its last window padded), and the corpus
is the shards' windows one after the other, in the order the path names them (a glob's matches
sorted)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from launcher.config.sources import expand, is_glob, names_many
from launcher.data.sequence import Sample
from launcher.data.tokens import PackedTokens, check_vocab, open_tokens, token_file
from launcher.errors import DataError


def shard_files(key: str, value: Any) -> list[Path]:
    """The files a path names, each an existing file; a DataError naming the key otherwise (an
    empty glob, a missing file, a directory)."""
    files: list[Path] = []
    for item in value if isinstance(value, (list, tuple)) else [value]:
        found = expand(item)
        if not found and is_glob(str(item)):
            raise DataError(
                f"{key}: the glob {item} matches no file. Fix: check the pattern (quote it, "
                f"e.g. {key}='shards/train-*.bin'), or list the files: {key}=[a.bin,b.bin]."
            )
        files += found
    for file in files:
        if not file.exists():
            raise DataError(f"{key}: no such file: {file}. Fix: point {key} at existing files.")
        if not file.is_file():
            raise DataError(f"{key}: {file} is not a file. Fix: name token files, not folders.")
    repeated = sorted({str(f) for f in files if files.count(f) > 1})
    if repeated:
        raise DataError(f"{key}: {repeated[0]} is named twice. Fix: name each shard once in {key}.")
    return files


class ShardedTokens:
    """The windows of several token files, one corpus."""

    def __init__(self, shards: list[PackedTokens]) -> None:
        self.shards = shards
        self.offsets = np.cumsum([0, *(len(s) for s in shards)])

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def __getitem__(self, index: int) -> Sample:
        if not 0 <= index < len(self):
            raise IndexError(index)
        s = int(np.searchsorted(self.offsets, index, side="right")) - 1
        return self.shards[s][index - int(self.offsets[s])]

    def eval_problems(self) -> list[tuple[bytes, bytes]]:
        return []


def token_corpus(
    key: str, value: Any, dtype: str, seq_len: int, vocab: int | None
) -> PackedTokens | ShardedTokens:
    """One token file, or the shards a list or glob names; every token id below `vocab`."""
    if not names_many(value):
        one = token_file(key, str(value), dtype, seq_len)
        if vocab is not None:
            check_vocab(key, Path(str(value)), dtype, vocab)
        return one
    files = shard_files(key, value)
    maps = [open_tokens(key, file, dtype) for file in files]
    total = sum(len(m) for m in maps)
    if max(len(m) for m in maps) < seq_len + 1:
        # One padded window repeated for every sample would train on almost nothing, silently.
        raise DataError(
            f"{key}: none of its {len(files)} files holds one window of tokens ({total:,} in "
            f"all; samples do not straddle files); one window is "
            f"model.seq_len + 1 = {seq_len + 1}. Fix: use more data, or a smaller model.seq_len."
        )
    if vocab is not None:
        for file in files:
            check_vocab(key, file, dtype, vocab)
    shards = [PackedTokens(m, seq_len) for m in maps]
    return ShardedTokens(shards)
