"""Tokenizing a dataset into its cache directory at the machine's speed, visibly, resumably.

Records are tokenized in ranges of BATCH by data.tokenize_workers processes (default: the
available cores; 1 tokenizes in this process) with the tokenizer's batched call, and appended in
record order: the cache is byte for byte the one a single process writes. A line every few
seconds says how far it is and when it should end. The files are written into a partial
directory beside the cache (launcher/data/partial.py), with a progress record of the records
whose tokens are wholly written; it is renamed into place only when complete, so a half cache is
never read. A preparation killed midway (kill -9, a lost node) is resumed by the next one from its
progress record: what was written after it is cut off, the rest is kept.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from launcher.data.partial import OWNER_FILE, leftovers, make_partial, mark, partial_name
from launcher.errors import LauncherError
from launcher.logs import get_logger
from launcher.tokenizing.worker import Job, Part, encode_range, setup
from launcher.userpath import open_own

log = get_logger("data")

BATCH = 1000
"""Records per task (and per batched tokenizer call)."""
PROGRESS_EVERY = 5.0
"""Seconds between progress lines."""
CHECKPOINT_EVERY = 1.0
"""Seconds between progress records (what a resumed preparation keeps)."""
PROGRESS_FILE = "progress.json"
ENDS_FILE = "ends.bin"
META_AFTER = ("eos_id", "vocab_size", "tuning")
"""meta.json's fields after the counts, in the order it has always had."""


@dataclass
class InProcess:
    """Records encoded in this process, a range at a time (conversations: transformers renders
    the chat template; the pool's workers import no transformers)."""

    records: Any
    encode: Callable[[dict[str, list[Any]], int], Iterable[tuple[list[int], list[int]]]]
    """(a range of records, the index of its first) -> each record's ids and target mask."""
    path: Path

    def part(self, span: tuple[int, int]) -> Part:
        first, last = span
        encoded = list(self.encode(self.records[first:last], first))
        lengths = np.asarray([len(ids) for ids, _ in encoded], dtype=np.int64)
        ids = np.fromiter((t for i, _ in encoded for t in i), np.uint32, int(lengths.sum()))
        mask = np.fromiter((m for _, t in encoded for m in t), np.uint8, int(lengths.sum()))
        return Part(ids, lengths, mask, int(ids.max()) if len(ids) else -1)


def _append(path: Path) -> Any:
    """The cache file `path` opened to append, never through a link (one data.cache_dir error)."""
    return os.fdopen(open_own(path, "data.cache_dir", os.O_WRONLY | os.O_APPEND), "ab")


class Writer:
    """Appends parts to tokens.bin (uint32), mask.bin (uint8, fine-tuning) and ends.bin (each
    record's end, int64) in `directory`, resuming from its progress record if it has one."""

    def __init__(self, directory: Path, tuning: bool) -> None:
        self.directory, self.tuning = directory, tuning
        self.records, self.tokens, self.top = self._resume_point()
        sizes = {"tokens.bin": 4 * self.tokens, ENDS_FILE: 8 * self.records}
        if tuning:
            sizes["mask.bin"] = self.tokens
        self.files = {name: _append(directory / name) for name in sizes}
        for name, size in sizes.items():
            self.files[name].truncate(size)  # what was written after the last progress record
        self.saved = time.monotonic()

    def _resume_point(self) -> tuple[int, int, int]:
        try:
            state = json.loads((self.directory / PROGRESS_FILE).read_text(encoding="utf-8"))
            records, tokens, top = (int(state[k]) for k in ("records", "tokens", "top"))
        except (OSError, ValueError, KeyError, TypeError):
            return 0, 0, -1
        need = {"tokens.bin": 4 * tokens, ENDS_FILE: 8 * records}
        if self.tuning:
            need["mask.bin"] = tokens
        for name, size in need.items():
            path = self.directory / name
            if not path.is_file() or path.stat().st_size < size:
                return 0, 0, -1  # less written than recorded: start again
        return records, tokens, top

    def append(self, part: Part) -> None:
        self.files["tokens.bin"].write(part.ids.tobytes())
        if part.mask is not None:
            self.files["mask.bin"].write(part.mask.tobytes())
        ends = self.tokens + np.cumsum(part.lengths, dtype=np.int64)
        self.files[ENDS_FILE].write(ends.tobytes())
        self.records += len(part.lengths)
        self.tokens += int(part.lengths.sum())
        self.top = max(self.top, part.top)
        if time.monotonic() - self.saved >= CHECKPOINT_EVERY:
            self.checkpoint()

    def checkpoint(self) -> None:
        """Record what is wholly written (the files flushed first)."""
        for f in self.files.values():
            f.flush()
        state = {"records": self.records, "tokens": self.tokens, "top": self.top}
        tmp = self.directory / f".{PROGRESS_FILE}"
        tmp.write_text(json.dumps(state), encoding="utf-8")
        tmp.replace(self.directory / PROGRESS_FILE)
        self.saved = time.monotonic()

    def finish(self, meta: dict[str, Any]) -> None:
        """The cache's final files: offsets.npy (each record's first token: packing and document
        masks read it) and meta.json; no working files."""
        for f in self.files.values():
            f.close()
        ends = self.directory / ENDS_FILE
        offsets = np.concatenate([[0], np.fromfile(ends, dtype=np.int64)]).astype(np.int64)
        np.save(self.directory / "offsets.npy", offsets)
        for name in (ENDS_FILE, PROGRESS_FILE, OWNER_FILE):
            (self.directory / name).unlink(missing_ok=True)
        counts = {"tokens": self.tokens, "records": self.records, "max_id": self.top}
        meta = {"format": meta["format"], **counts} | {k: meta[k] for k in META_AFTER}
        text = json.dumps(meta, indent=1) + "\n"
        (self.directory / "meta.json").write_text(text, encoding="utf-8")


class Progress:
    """A line every PROGRESS_EVERY seconds: records and tokens done, the rate, the time left."""

    def __init__(self, name: str, total: int, done: int) -> None:
        self.name, self.total, self.done_before = name, total, done
        self.start = self.last = time.monotonic()

    def update(self, records: int, tokens: int) -> None:
        now = time.monotonic()
        if now - self.last < PROGRESS_EVERY:
            return
        self.last = now
        rate = (records - self.done_before) / max(now - self.start, 1e-9)
        left = (self.total - records) / rate if rate > 0 else float("inf")
        eta = f"{left:.0f}s" if left < 1e9 else "?"
        log.info(
            f"tokenizing {self.name}: {records / self.total:.0%} ({records:,} of "
            f"{self.total:,} records), {tokens:,} tokens, "
            f"{tokens / max(now - self.start, 1e-9):,.0f} tokens/s, eta {eta}"
        )


def _parts(spans: list[tuple[int, int]], job: Job | InProcess, workers: int) -> Iterator[Part]:
    if isinstance(job, InProcess):
        yield from map(job.part, spans)
        return
    if workers == 1 or len(spans) < 2:
        setup(job)
        yield from map(encode_range, spans)
        return
    ctx = multiprocessing.get_context("spawn")  # a clean interpreter: no locks or threads copied
    with ctx.Pool(min(workers, len(spans)), setup, (job, os.getpid())) as pool:
        yield from pool.imap(encode_range, spans)


def _partial_for(final: Path) -> Path:
    """A partial directory of ours: one a dead preparation left (the furthest on), else new."""
    dead, _ = leftovers(final)
    furthest = max(dead, key=_records_in, default=None)
    for path in dead:
        if path != furthest or _records_in(path) == 0:
            shutil.rmtree(path)
            log.info(f"removed {path}, left by a killed preparation.")
    if furthest is None or not furthest.exists():
        return make_partial(final)
    tmp = partial_name(final)
    furthest.rename(tmp)  # ours now: a later preparation sees this process as its owner
    mark(tmp)
    log.info(f"resuming the preparation a killed process left at {_records_in(tmp):,} records.")
    return tmp


def _records_in(path: Path) -> int:
    try:
        return int(json.loads((path / PROGRESS_FILE).read_text(encoding="utf-8"))["records"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def build_cache(final: Path, job: Job | InProcess, meta: dict[str, Any], workers: int) -> None:
    """Tokenize `job` into `final` (call under the cache's lock). meta: the fields of meta.json
    beside the counts (format, eos_id, vocab_size, tuning)."""
    total = len(job.records)
    tmp = _partial_for(final)
    try:
        writer = Writer(tmp, tuning=bool(meta["tuning"]))
        spans = [(i, min(i + BATCH, total)) for i in range(writer.records, total, BATCH)]
        single = workers == 1 or len(spans) < 2 or isinstance(job, InProcess)
        used = 1 if single else min(workers, len(spans))
        log.info(
            f"tokenizing {job.path} ({total:,} records) once with {used} process(es); cached "
            f"in {final}"
        )
        progress = Progress(job.path.name, total, writer.records)
        for part in _parts(spans, job, workers):
            writer.append(part)
            progress.update(writer.records, writer.tokens)
        writer.finish(meta)
    except LauncherError:  # bad data: nothing worth resuming
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    try:
        tmp.rename(final)
    except OSError:  # another node built it meanwhile (a lock the file system ignores)
        shutil.rmtree(tmp, ignore_errors=True)
