"""The largest token id of a flat token file (the vocabulary check), read once per file identity.

The first check of a file reads it whole in chunks (memory stays flat); the answer is kept with
the file's identity (resolved path, size, modification time, inode: launcher/integrity/file_cache)
in `token_scans.json` beside the digests' cache, and in this process. A later launch, restart,
requeue or sweep point on the same, unchanged file only stats it. A file rewritten, appended to,
touched or replaced is read again. One entry per file and dtype: a corpus of many shards is
checked shard by shard, and only new or changed shards are read.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from launcher.integrity.file_cache import cached_fact, remember, stamp
from launcher.logs import get_logger

CACHE_FILE = "token_scans.json"
SCAN_CHUNK = 1 << 22
"""Tokens read at a time: memory stays flat however big the file is."""

log = get_logger("data")

scans: list[Path] = []
"""Every file read whole by this process, in order (what tests count: a cached check adds none)."""
_seen: dict[str, tuple[list[int], tuple[int, int]]] = {}


def scan_max_token(path: Path, dtype: str) -> tuple[int, int]:
    """(largest token id, its index) by chunked reads, not the map: resident memory stays flat."""
    best, where, offset = -1, -1, 0
    with open(path, "rb") as f:
        while True:
            chunk = np.fromfile(f, dtype=dtype, count=SCAN_CHUNK)
            if not len(chunk):
                return best, where
            i = int(chunk.argmax())
            if int(chunk[i]) > best:
                best, where = int(chunk[i]), offset + i
            offset += len(chunk)


def max_token_id(path: Path, dtype: str) -> tuple[int, int]:
    """(largest token id, its index) of a `dtype` token file; read whole only when this file
    identity (path, size, mtime, inode) has not been scanned before, here or by an earlier
    launch."""
    key = f"{path.resolve()}:{dtype}"
    at = stamp(path)
    known = _seen.get(key)
    if known is not None and known[0] == at:
        return known[1]
    cached = cached_fact(CACHE_FILE, key, path, 2)
    if cached is not None and all(isinstance(v, int) for v in cached):
        found = (int(str(cached[0])), int(str(cached[1])))
    else:
        started = time.perf_counter()
        found = scan_max_token(path, dtype)
        scans.append(path)
        took = time.perf_counter() - started
        tokens = at[0] // np.dtype(dtype).itemsize
        log.info(
            f"vocabulary check: read {tokens:,} tokens of {path} in {took:.1f} s, once (the "
            "largest id is remembered until the file changes)"
        )
        remember(CACHE_FILE, key, path, list(found), at)
    _seen[key] = (at, found)
    return found
