"""Shards and mixtures in the data section: a path that names many files (a list, or a glob), and
the checks of `data.sources` (each a name, a weight and its own data fields)."""

from __future__ import annotations

import glob
import math
from pathlib import Path
from typing import Any

from launcher.errors import ConfigError

GLOB_CHARS = "*?["
MIXABLE = ("tokens", "hf")
"""The data kinds a `data.sources` mixture takes."""


def is_glob(value: str) -> bool:
    return any(c in value for c in GLOB_CHARS)


def path_list(key: str, value: Any) -> list[str]:
    """data.path (or a source's path) as a list of strings: one path, a glob, or a list of them.
    Raises ConfigError for anything else (an empty list, a number, an empty string)."""
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    if not items:
        raise ConfigError(key, "is an empty list.", f"give {key} at least one file.")
    for item in items:
        if not isinstance(item, str) or not item.strip():
            raise ConfigError(
                key,
                f"must be a file, a glob or a list of them, got {item!r}.",
                f"write {key}=train.bin, {key}='shards/train-*.bin' or {key}=[a.bin,b.bin].",
            )
    return [str(item) for item in items]


def names_many(value: Any) -> bool:
    """A path that names several files (a list or a glob), not one file or directory."""
    return isinstance(value, (list, tuple)) or (isinstance(value, str) and is_glob(value))


def expand(value: Any) -> list[Path]:
    """The files a path names, in order: each list entry in turn, a glob's matches sorted. What
    does not exist is kept as written (the data checks name it); an empty glob gives nothing."""
    found: list[Path] = []
    for item in value if isinstance(value, (list, tuple)) else [value]:
        text = str(Path(str(item)).expanduser())
        if is_glob(text):
            found += [Path(p) for p in sorted(glob.glob(text))]
        else:
            found.append(Path(text))
    return found


def absolute(value: Any) -> Any:
    """The path (list entries each) made absolute; a glob's directory resolved, its pattern kept."""
    if isinstance(value, (list, tuple)):
        return [absolute(v) for v in value]
    path = Path(str(value)).expanduser()
    if is_glob(str(path)):
        return str(path if path.is_absolute() else Path.cwd() / path)
    return str(path.resolve())


def check_sources(kind: str, sources: list[Any], path: Any, holdout: int) -> None:
    """data.sources: names unique and plain, weights positive, a path each; the kind mixable."""
    if not sources:
        return
    if kind not in MIXABLE:
        raise ConfigError(
            "data.sources",
            f"mixes token corpora and data=hf sources, not data={kind}.",
            "use data=tokens (or data=hf) with data.sources.",
        )
    if path is not None:
        raise ConfigError(
            ["data.path", "data.sources"],
            "give the files either in data.path (one corpus) or in data.sources (a mixture).",
            "drop data.path (data.path=null) and put each source's path in data.sources.",
        )
    if holdout:
        raise ConfigError(
            ["data.holdout", "data.sources"],
            "a mixture holds no samples out.",
            "drop data.holdout and give held-out data with data.val_path=FILE.",
        )
    seen: set[str] = set()
    example = "{name:web,path:web/*.bin,weight:0.75}"
    for i, source in enumerate(sources):
        key = f"data.sources[{i}]"
        name = source.name
        if not name or not all(c.isalnum() or c in "_-." for c in name):
            raise ConfigError(
                f"{key}.name",
                f"needs a name of letters, digits, '_', '-' or '.', got {name!r} (it names the "
                "source's metrics, tokens/NAME).",
                f"write each source as {example}.",
            )
        if name in seen:
            raise ConfigError(
                f"{key}.name", f"{name!r} names two sources.", "give each source its own name."
            )
        seen.add(name)
        if not (source.weight > 0 and math.isfinite(source.weight)):
            raise ConfigError(
                f"{key}.weight",
                f"source {name!r} needs a positive, finite weight, got {source.weight}.",
                f"write each source as {example} (weights are normalised to sum to 1).",
            )
        if source.path is None:
            raise ConfigError(
                f"{key}.path", f"source {name!r} needs its files.", f"write it as {example}."
            )
        path_list(f"{key}.path", source.path)
        unread = "dtype" if kind != "tokens" and source.dtype else None
        unread = "text_field" if kind == "tokens" and source.text_field else unread
        if unread:  # a field the kind does not read would be ignored without a word
            raise ConfigError(
                f"{key}.{unread}",
                f"a data={kind} source has no {unread} (dtype: tokens; text_field: hf).",
                f"drop {unread}:... from source {name!r}.",
            )
        if kind != "tokens" and names_many(source.path):
            raise ConfigError(
                f"{key}.path",
                f"a data={kind} source reads one file (or dataset directory), got {source.path!r}.",
                "give each file its own source: "
                "[{name:a1,path:a1.jsonl,weight:0.25},{name:a2,path:a2.jsonl,weight:0.25},...].",
            )
