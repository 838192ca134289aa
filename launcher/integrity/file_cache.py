"""A small JSON cache in the launcher's cache directory of facts about files (a digest, the largest
token id), each entry valid while the file's identity is unchanged: its resolved path, size,
modification time and inode. A cache that cannot be read or written only means the file is read
again; a damaged entry is ignored."""

from __future__ import annotations

import json
from pathlib import Path

from launcher.errors import ConfigError
from launcher.host import CACHE_ENV, cache_dir
from launcher.userpath import replace_own


def stamp(path: Path) -> list[int]:
    """[size, mtime_ns, inode]: what must be unchanged for a cached fact to hold."""
    st = path.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def cache_file(name: str) -> Path:
    return cache_dir() / name


def read_cache(name: str) -> dict[str, list[object]]:
    try:
        data = json.loads(cache_file(name).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_cache(name: str, data: dict[str, list[object]]) -> None:
    """Write the whole cache by a rename of a hidden random temporary of ours (a reader never sees
    half; a link planted at the cache file is never written through)."""
    path = cache_file(name)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        replace_own(path, json.dumps(data), CACHE_ENV)
    except (OSError, ConfigError):  # unwritable, or a link there
        pass  # an unwritable cache only means the next launch reads the files again


def cached_fact(name: str, key: str, path: Path, size: int) -> list[object] | None:
    """The `size` values cached for `key` if `path` still has the identity they were taken at."""
    entry = read_cache(name).get(key)
    if isinstance(entry, list) and len(entry) == 3 + size and entry[:3] == stamp(path):
        return entry[3:]
    return None


def remember(name: str, key: str, path: Path, values: list[object], at: list[int]) -> None:
    """Cache `values` for `key`, taken when `path` had the identity `at` (stamped before the
    read: a file changed during it is not remembered as the new one)."""
    if stamp(path) != at:
        return
    data = read_cache(name)
    data[key] = [*at, *values]
    write_cache(name, data)
