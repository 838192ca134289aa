"""What one tokenizing process does: records [first, last) of the dataset to flat arrays, the
same for any split of the records into ranges (launcher/data/prepare_cache.py appends them in
order). Runs in the preparing process itself (data.tokenize_workers=1) or in each process of a
pool started with `spawn` (a clean interpreter: nothing of the launching process is inherited
but what is passed; this module imports no torch, so such a process starts in about a second)."""

from __future__ import annotations

import itertools
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from launcher.errors import DataError


@dataclass
class Part:
    """Records [first, last) tokenized: ids back to back (each record ends with EOS), each
    record's length, and for fine-tuning the target mask (0 = a prompt token)."""

    ids: np.ndarray
    lengths: np.ndarray
    mask: np.ndarray | None
    top: int


@dataclass
class Job:
    records: Any
    """The dataset (a datasets.Dataset: memory-mapped Arrow, pickled by reference)."""
    backend: Any
    """A tokenizers.Tokenizer (fast) or a transformers tokenizer; both pickle."""
    fast: bool
    eos_id: int
    named: dict[str, str]
    """{config key: field name}: one text field, or the prompt and completion fields."""
    path: Path


_job: Job | None = None


def encode(backend: Any, fast: bool, texts: list[str]) -> list[list[int]]:
    """Token ids of each text, no special tokens, in one batched call."""
    if fast:
        return [e.ids for e in backend.encode_batch(texts, add_special_tokens=False)]
    return list(backend(texts, add_special_tokens=False)["input_ids"])


def setup(job: Job, parent: int | None = None) -> None:
    """Take `job` in this process; in a pool's process (parent given), one tokenizer thread per
    process and an exit when the parent is gone (a kill -9 of the launch leaves none behind)."""
    global _job
    if parent is not None:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"  # the pool is the parallelism
        threading.Thread(target=_exit_with, args=(parent,), daemon=True).start()
    _job = job


def _exit_with(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)


def _texts(values: list[Any], name: str, key: str, path: Path, first: int) -> list[str]:
    for i, v in enumerate(values):
        if not isinstance(v, str):
            raise DataError(
                f"{key}: record {first + i} of {path} has {name}={v!r}, not a string. "
                "Fix: clean the data, or point the field key at a text field."
            )
    return values


def encode_range(span: tuple[int, int]) -> Part:
    """Records [first, last) of the job set up in this process."""
    assert _job is not None, "setup() first"
    first, last = span
    batch = _job.records[first:last]
    cols = [
        encode(_job.backend, _job.fast, _texts(batch[name], name, key, _job.path, first))
        for key, name in _job.named.items()
    ]
    eos = [_job.eos_id]
    lengths = np.fromiter(
        (sum(map(len, parts)) + 1 for parts in zip(*cols, strict=True)), dtype=np.int64
    )
    docs = (itertools.chain(*parts, eos) for parts in zip(*cols, strict=True))
    total = int(lengths.sum())
    ids = np.fromiter(itertools.chain.from_iterable(docs), dtype=np.uint32, count=total)
    mask = None
    if len(cols) == 2:  # fine-tuning: the prompt's tokens are never targets
        mask = np.ones(total, dtype=np.uint8)
        starts = np.cumsum(lengths) - lengths
        for start, prompt in zip(starts.tolist(), cols[0], strict=True):
            mask[start : start + len(prompt)] = 0
    top = int(ids.max()) if total else -1
    return Part(ids, lengths, mask, top)
