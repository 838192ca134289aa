"""SHA-256 digests of files. A file already digested whose size, mtime and inode are unchanged
is not read again: in this process (checkpoints read twice by one command), and across processes
through a small cache file (large data files read at every launch)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from launcher.integrity.file_cache import read_cache, write_cache

CACHE_FILE = "digests.json"
_CHUNK = 1 << 20

_seen: dict[str, tuple[tuple[int, int, int], str]] = {}


def _stamp(path: Path) -> tuple[int, int, int]:
    st = path.stat()
    return st.st_size, st.st_mtime_ns, st.st_ino


def _compute(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def file_digest(path: Path) -> str:
    """The file's digest; read again only when its size, mtime or inode changed since this
    process last read it."""
    key, stamp = str(path.resolve()), _stamp(path)
    known = _seen.get(key)
    if known is not None and known[0] == stamp:
        return known[1]
    digest = _compute(path)
    _seen[key] = (stamp, digest)
    return digest


def cached_digests(paths: list[Path]) -> dict[Path, str]:
    """Digests of many files through the on-disk cache: only new or changed files are read."""
    cache = read_cache(CACHE_FILE)
    out: dict[Path, str] = {}
    changed = False
    for path in paths:
        key, stamp = str(path.resolve()), list(_stamp(path))
        entry = cache.get(key)
        if isinstance(entry, list) and len(entry) == 4 and entry[:3] == stamp:
            out[path] = str(entry[3])
            continue
        out[path] = file_digest(path)
        cache[key] = [*stamp, out[path]]
        changed = True
    if changed:
        write_cache(CACHE_FILE, cache)
    return out


TENSORS_CACHE_FILE = "tensor_digests.json"


def _tensors_digest(path: Path) -> str:
    """A safetensors file by its tensors: each name, dtype, shape and bytes, in name order; its
    header's free-form `__metadata__` (an export's provenance) and the tensors' order left out."""
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
        start = 8 + size
        digest = hashlib.sha256()
        for name in sorted(k for k in header if k != "__metadata__"):
            entry = header[name]
            begin, end = entry["data_offsets"]
            digest.update(f"{name}:{entry['dtype']}:{entry['shape']}:{end - begin}\n".encode())
            f.seek(start + begin)
            left = end - begin
            while left:
                chunk = f.read(min(_CHUNK, left))
                if not chunk:
                    raise OSError(f"{path} ends inside tensor {name}")
                digest.update(chunk)
                left -= len(chunk)
    return digest.hexdigest()


def weights_digest(path: Path) -> str:
    """What a weights file holds: a safetensors file by its tensors (a re-export of the same
    weights has the same digest whatever its metadata), any other file by its bytes; cached by
    file identity like the digests."""
    if path.suffix != ".safetensors":
        return cached_digests([path])[path]
    cache = read_cache(TENSORS_CACHE_FILE)
    key, stamp = str(path.resolve()), list(_stamp(path))
    entry = cache.get(key)
    if isinstance(entry, list) and len(entry) == 4 and entry[:3] == stamp:
        return str(entry[3])
    try:
        digest = _tensors_digest(path)
    except (ValueError, KeyError, TypeError):  # not a safetensors file after all: its bytes
        return cached_digests([path])[path]
    cache[key] = [*stamp, digest]
    write_cache(TENSORS_CACHE_FILE, cache)
    return digest
