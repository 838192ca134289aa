"""data=hf: a local dataset (parquet, json/jsonl, arrow, csv, or a saved dataset directory) read
with `datasets`, tokenized once with a local tokenizer and cached on disk as flat token files.

Pretraining (data.text_field): documents, each followed by EOS. Fine-tuning (data.prompt_field,
data.completion_field): prompt + completion + EOS per record, prompt tokens never targets (-100);
conversations (data.messages_field): rendered with the chat template (launcher/data/chat.py).
How records become sequences (padded, packed whole, concatenated; each document's own positions
and attention) is launcher/data/packed.py's.

The cache key covers the data files' identity (path, size, modification time), the tokenizer's
files, the fields, the chat template and EOS; not seq_len or packing, which only change how
windows are cut (a packed layout is computed once per seq_len beside the cache). One
process tokenizes under a file lock while the others wait on it (in-process, torchrun, SLURM on a
shared file system), with data.tokenize_workers processes (launcher/data/prepare_cache.py); the
result is renamed into place whole, so a reader never sees half of it, and a killed preparation
is resumed by the next.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from launcher.config.data import DataConfig
from launcher.data.packed import open_layout
from launcher.data.prepare_cache import InProcess, build_cache
from launcher.data.sequence import TokenDataset
from launcher.data.tokenizer import load_tokenizer, require
from launcher.errors import ConfigError, DataError, VocabTooSmall
from launcher.host import cache_dir, local_cpu_count
from launcher.logs import get_logger
from launcher.tokenizing.worker import Job
from launcher.userpath import open_own, refuse_link
from launcher.userpath.check import quoted

log = get_logger("data")

FORMAT = 2
"""Bumped when the cache layout changes (2: offsets.npy for every cache, documents too)."""
BUILDERS = {".parquet": "parquet", ".json": "json", ".jsonl": "json", ".arrow": "arrow"}
BUILDERS[".csv"] = "csv"
SAVED_MARKS = ("dataset_info.json", "state.json", "dataset_dict.json")


def cache_root(cfg: DataConfig) -> Path:
    default = os.environ.get("LAUNCHER_CACHE") or cache_dir() / "data"  # beside token_scans.json
    return Path(cfg.cache_dir or default).expanduser()


def data_identity(path: Path) -> list[tuple[str, int, int]]:
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    return [(str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns) for f in files]


def fields(cfg: DataConfig) -> dict[str, str]:
    if cfg.messages_field is not None:
        return {"data.messages_field": cfg.messages_field}
    if cfg.prompt_field is not None and cfg.completion_field is not None:
        return {
            "data.prompt_field": cfg.prompt_field,
            "data.completion_field": cfg.completion_field,
        }
    return {"data.text_field": cfg.text_field}


def load_records(key: str, path: Path, cfg: DataConfig, hf_cache: Path) -> Any:
    """The dataset's records (a datasets.Dataset), its fields checked."""
    datasets = require("datasets")
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    if not path.exists():
        raise DataError(f"{key}: no such file or directory: {path}. Fix: point {key} at the data.")
    try:
        if path.is_dir() and any((path / m).is_file() for m in SAVED_MARKS):
            ds = datasets.load_from_disk(str(path))
        elif path.is_dir():
            ds = datasets.load_dataset(str(path), cache_dir=str(hf_cache))
        elif path.suffix in BUILDERS:
            ds = datasets.load_dataset(
                BUILDERS[path.suffix], data_files=str(path), split="train", cache_dir=str(hf_cache)
            )
        else:
            raise DataError(
                f"{key}: {path} has suffix {path.suffix!r}; data=hf reads "
                f"{', '.join(BUILDERS)} files or a dataset directory. Fix: rename or convert it."
            )
    except DataError:
        raise
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise DataError(
            f"{key}: cannot read {path} ({type(exc).__name__}: {first}). Fix: check the file's "
            "format (one JSON object per line for .jsonl)."
        ) from None
    if isinstance(ds, (datasets.DatasetDict, dict)):
        if cfg.split not in ds:
            raise DataError(
                f"data.split: {path} has no split {cfg.split!r} (it has {', '.join(ds)}). "
                f"Fix: data.split={next(iter(ds))}."
            )
        ds = ds[cfg.split]
    names = list(ds.column_names)
    for field_key, name in fields(cfg).items():
        if name not in names:
            raise DataError(
                f"{field_key}: no field {name!r} in {path} (its fields: {', '.join(names)}). "
                f"Fix: {field_key}=<one of those>."
            )
    return ds


def _refuse_foreign(final: Path) -> None:
    """The cache directory is the launcher's own, renamed into place whole: a link there, or
    something without meta.json, was put there by someone else and is never read or replaced."""
    refuse_link(final, "data.cache_dir")
    if final.exists() and not (final / "meta.json").is_file():
        raise ConfigError(
            "data.cache_dir",
            f"{final} is there but is not a tokenized cache the launcher finished (no meta.json).",
            f"move it away (the launcher tokenizes again): mv {quoted(final)} "
            f"{quoted(f'{final}.old')}",
        )


def prepare(key: str, path_text: str, cfg: DataConfig) -> tuple[Path, bool]:
    """The tokenized cache directory of one data file, built if missing; (dir, built here)."""
    path = Path(path_text).expanduser().resolve()
    if not path.exists():
        raise DataError(f"{key}: no such file or directory: {path}. Fix: point {key} at the data.")
    tok = load_tokenizer(cfg.tokenizer or "", cfg.eos_token)
    ident = {"format": FORMAT, "data": data_identity(path), "tokenizer": tok.identity()}
    ident |= {"fields": fields(cfg), "split": cfg.split, "eos": tok.eos_id}
    if cfg.messages_field is not None:
        from launcher.data.chat import chat_identity

        ident["chat"] = chat_identity(cfg, tok)
    digest = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:20]
    root = cache_root(cfg)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{path.stem}-{digest}"
    with open(open_own(root / f"{final.name}.lock", "data.cache_dir"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the first process builds; the others wait here
        _refuse_foreign(final)
        if (final / "meta.json").is_file():
            return final, False
        ds = load_records(key, path, cfg, root / "hf")
        job: Job | InProcess
        if cfg.messages_field is not None:  # transformers renders the template: in this process
            from launcher.data.chat import ConversationEncoder

            job = InProcess(ds, ConversationEncoder(tok, cfg, path), path)
        else:
            job = Job(ds, tok.backend, tok.fast, tok.eos_id, fields(cfg), path)
        meta = {"format": FORMAT, "eos_id": tok.eos_id, "vocab_size": tok.vocab_size}
        meta["tuning"] = cfg.tuning
        build_cache(final, job, meta, cfg.tokenize_workers or local_cpu_count())
        return final, True


def open_cached(
    directory: Path, cfg: DataConfig, seq_len: int, vocab_size: int | None
) -> TokenDataset:
    meta = json.loads((directory / "meta.json").read_text(encoding="utf-8"))
    if vocab_size is not None and max(meta["max_id"] + 1, meta["vocab_size"]) > vocab_size:
        raise VocabTooSmall(
            f"data.tokenizer: {cfg.tokenizer} has a vocabulary of {meta['vocab_size']} (its "
            f"largest id in {directory.name} is {meta['max_id']}), past the model's vocabulary "
            f"of {vocab_size}.",
            max(meta["max_id"] + 1, meta["vocab_size"]),
            "use the model's own tokenizer.",
            tokenizer=True,
        )
    tokens = np.memmap(directory / "tokens.bin", dtype=np.uint32, mode="r")
    mask = np.memmap(directory / "mask.bin", dtype=np.uint8, mode="r") if meta["tuning"] else None
    offsets = np.load(directory / "offsets.npy")
    return open_layout(directory, cfg, seq_len, tokens, mask, offsets, meta["eos_id"])


def hf_dataset(
    key: str, path: str, cfg: DataConfig, seq_len: int, vocab_size: int | None
) -> tuple[TokenDataset, bool]:
    """The tokenized dataset of data.path or data.val_path; and whether it was tokenized now."""
    directory, built = prepare(key, path, cfg)
    return open_cached(directory, cfg, seq_len, vocab_size), built
