"""SHA-256 digests of files. A file already digested whose size, mtime and inode are unchanged
is not read again: in this process (checkpoints read twice by one command), and across processes
through a small cache file (large data files read at every launch)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from launcher.errors import ConfigError
from launcher.host import CACHE_ENV, cache_dir
from launcher.userpath import replace_own

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


def _cache_path() -> Path:
    return cache_dir() / CACHE_FILE


def _read_cache() -> dict[str, list[object]]:
    try:
        data = json.loads(_cache_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_cache(data: dict[str, list[object]]) -> None:
    path = _cache_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        replace_own(path, json.dumps(data), CACHE_ENV)  # a hidden random temporary, renamed
    except (OSError, ConfigError):  # unwritable, or a link there (never written through)
        pass  # an unwritable cache only means the next launch reads the files again


def cached_digests(paths: list[Path]) -> dict[Path, str]:
    """Digests of many files through the on-disk cache: only new or changed files are read."""
    cache = _read_cache()
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
        _write_cache(cache)
    return out
