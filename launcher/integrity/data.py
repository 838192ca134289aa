"""The identity of the data a run reads: for each local file (data.path and each of its shards,
data.val_path, every data.sources source's files, the tokenizer's files) its size and content
digest, recorded in every checkpoint and compared when a run resumes. Entries are named by config
key (and the file's name inside a directory or below a list's or glob's common directory), not by
absolute path: data moved elsewhere with the same content resumes; changed content does not (nor
a shard gone or added)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from launcher.config.data import DataConfig
from launcher.config.sources import expand, names_many
from launcher.errors import ConfigError
from launcher.integrity.digests import cached_digests
from launcher.logs import get_logger

ALLOW_KEY = "checkpoint.allow_data_change"

log = get_logger("checkpoint")


def _shards(key: str, value: Any) -> dict[str, Path]:
    """A list or glob of files: one entry each, named by its path below the files' common
    directory (data.path/train-00000.bin)."""
    files = [f for f in expand(value) if f.is_file()]
    if not files:
        return {}
    common = Path(os.path.commonpath([str(f.resolve().parent) for f in files]))
    return {f"{key}/{f.resolve().relative_to(common)}": f for f in files}


def source_files(cfg: DataConfig) -> dict[str, Path]:
    """{entry name: file} for every local file the data section reads: one file by its key, each
    file of a directory, of a list or glob, and of every data.sources source (data.sources.NAME)."""
    named: dict[str, Any] = {
        "data.path": cfg.path,
        "data.val_path": cfg.val_path,
        "data.tokenizer": cfg.tokenizer,
    }
    named.update({f"data.sources.{s.name}": s.path for s in cfg.sources})
    found: dict[str, Path] = {}
    for key, value in named.items():
        if not value:
            continue
        if names_many(value):
            found.update(_shards(key, value))
            continue
        path = Path(value).expanduser()
        if path.is_file():
            found[key] = path
        elif path.is_dir():
            for file in sorted(path.rglob("*")):
                if file.is_file() and not file.is_symlink():
                    found[f"{key}/{file.relative_to(path)}"] = file
    return found


def data_identity(cfg: DataConfig) -> dict[str, dict[str, Any]]:
    files = source_files(cfg)
    digests = cached_digests(list(files.values()))
    identity: dict[str, dict[str, Any]] = {}
    counts: dict[str, int] = {}
    for name, file in files.items():
        entry: dict[str, Any] = {"path": str(file), "size": file.stat().st_size}
        entry["sha256"] = digests[file]
        if "/" in name:  # a shard's place in its list: the corpus is the shards in that order
            key = name.split("/", 1)[0]
            entry["position"] = counts[key] = counts.get(key, -1) + 1
        identity[name] = entry
    return identity


def changes(recorded: dict[str, Any], current: dict[str, dict[str, Any]]) -> list[str]:
    """What differs, one phrase per source, naming its file."""
    found = []
    for name, was in sorted(recorded.items()):
        now = current.get(name)
        where = was.get("path", name)
        if now is None:
            found.append(f"{name} ({where}) is gone")
        elif now["size"] != was["size"]:
            found.append(f"{name} ({now['path']}) has {now['size']} bytes, was {was['size']}")
        elif now["sha256"] != was["sha256"]:
            found.append(f"{name} ({now['path']}) has the same size but other content")
        elif was.get("position", now.get("position")) != now.get("position"):
            found.append(
                f"{name} ({now['path']}) is file {now['position'] + 1} of its list, was "
                f"{was['position'] + 1} (the order of the samples follows the files' order)"
            )
    for name in sorted(set(current) - set(recorded)):
        found.append(f"{name} ({current[name]['path']}) is new")
    return found


def check_data_unchanged(
    recorded: Any, cfg: DataConfig, checkpoint: Path, allowed: bool = False
) -> None:
    """Refuse to resume `checkpoint` on data other than what it trained on; with `allowed`
    (checkpoint.allow_data_change=true) say what changed and go on."""
    if not isinstance(recorded, dict):
        return  # a checkpoint written before data identity was recorded
    found = changes(recorded, data_identity(cfg))
    if found and allowed:
        log.warning(
            f"{ALLOW_KEY}=true: the data changed since {checkpoint} was saved "
            f"({'; '.join(found)}); resuming on the new data."
        )
    elif found:
        raise ConfigError(
            ALLOW_KEY,
            f"the data changed since {checkpoint} was saved: {'; '.join(found)}. Resuming "
            "would train on other samples than the ones the run's steps refer to.",
            "restore the data it was trained on; or, to go on knowingly with the new data, add "
            f"{ALLOW_KEY}=true.",
        )
