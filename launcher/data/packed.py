"""How cached records (launcher/data/hf.py) become sequences, for each data.packing:

- false, fine-tuning: one record per sequence, cut at seq_len + 1 tokens, padded (PaddedRecords);
- true: records placed whole (launcher/data/packing.py), each with positions 0, 1, ... of its
  own, so the model attends within each record only (PackedRecords);
- concat (and pretraining's documents under false): all records concatenated and cut into full
  windows (PackedTokens); with document masks (data.cross_document_attention=false, the default)
  positions restart where a record starts (its first token, the one after the previous EOS), and
  a window's first token starts a document too (DocumentWindows).

Positions restart at 0 at each document; the model derives the documents from them
(launcher/models/documents.py). Padding after the last record is a document of its own, never a
target.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import torch

from launcher.config.data import DataConfig
from launcher.config.records import CONCAT
from launcher.data.notes import PackingFacts, concatenated, whole_records
from launcher.data.packing import packed_layout, record_positions
from launcher.data.records import PaddedRecords
from launcher.data.sequence import IGNORE_INDEX, Sample, TokenDataset
from launcher.data.tokens import PackedTokens
from launcher.logs import get_logger

log = get_logger("data")


class PackedRecords:
    """Window w: records order[starts[w]:starts[w + 1]] back to back, each cut at seq_len + 1."""

    def __init__(
        self,
        tokens: np.ndarray,
        mask: np.ndarray | None,
        offsets: np.ndarray,
        layout: tuple[np.ndarray, np.ndarray],
        seq_len: int,
        pad_id: int,
    ) -> None:
        self.tokens, self.mask, self.offsets = tokens, mask, offsets
        self.order, self.starts = layout
        self.seq_len, self.pad_id = seq_len, pad_id
        self.packing = whole_records(record_positions(offsets, seq_len), self.starts, seq_len)
        """How many records went into how many windows, and the fill (launcher/data/notes.py)."""

    def __len__(self) -> int:
        return len(self.starts) - 1

    def __getitem__(self, index: int) -> Sample:
        if not 0 <= index < len(self):
            raise IndexError(index)
        inputs = torch.full((self.seq_len,), self.pad_id, dtype=torch.long)
        targets = torch.full((self.seq_len,), IGNORE_INDEX, dtype=torch.long)
        positions = torch.zeros(self.seq_len, dtype=torch.long)
        at = 0
        for record in self.order[self.starts[index] : self.starts[index + 1]].tolist():
            start = int(self.offsets[record])
            end = min(int(self.offsets[record + 1]), start + self.seq_len + 1)
            ids = torch.from_numpy(np.asarray(self.tokens[start:end], dtype=np.int64))
            n = len(ids) - 1
            inputs[at : at + n] = ids[:-1]
            targets[at : at + n] = ids[1:]
            if self.mask is not None:
                trained = torch.from_numpy(np.asarray(self.mask[start + 1 : end], dtype=np.bool_))
                targets[at : at + n][~trained] = IGNORE_INDEX
            positions[at : at + n] = torch.arange(n)
            at += n
        positions[at:] = torch.arange(self.seq_len - at)  # padding: a document of its own
        return Sample(inputs, targets, positions)

    def eval_problems(self) -> list[tuple[bytes, bytes]]:
        return []


class DocumentWindows:
    """PackedTokens' windows, with positions restarting at each document's first token."""

    def __init__(self, windows: PackedTokens, offsets: np.ndarray) -> None:
        self.windows, self.offsets = windows, offsets
        self.packing: PackingFacts | None = windows.packing

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, index: int) -> Sample:
        sample = self.windows[index]
        first = index * self.windows.seq_len
        at = np.arange(first, first + self.windows.seq_len, dtype=np.int64)
        doc_start = self.offsets[np.searchsorted(self.offsets, at, side="right") - 1]
        positions = torch.from_numpy(at - np.maximum(doc_start, first))
        return Sample(sample.input_ids, sample.targets, positions)

    def eval_problems(self) -> list[tuple[bytes, bytes]]:
        return []


@functools.cache
def _warn_cut(directory: str, seq_len: int, cut: int, total: int) -> None:
    log.warning(
        f"{cut:,} of {total:,} records in {directory} are longer than model.seq_len + 1 = "
        f"{seq_len + 1} tokens and are cut there (their tail is not trained). Fix: raise "
        "model.seq_len to keep them whole, or data.packing=concat to train on every token."
    )


def open_layout(
    directory: Path,
    cfg: DataConfig,
    seq_len: int,
    tokens: np.ndarray,
    mask: np.ndarray | None,
    offsets: np.ndarray,
    pad_id: int,
) -> TokenDataset:
    """The sequences of a cache directory for data.packing (see the module's docstring)."""
    whole = cfg.packing is True or (cfg.tuning and cfg.packing is False)
    if whole:
        cut = int((np.diff(offsets) > seq_len + 1).sum())
        if cut:
            _warn_cut(str(directory), seq_len, cut, len(offsets) - 1)
    if cfg.packing is True:
        layout = packed_layout(directory, offsets, seq_len)
        return PackedRecords(tokens, mask, offsets, layout, seq_len, pad_id)
    if whole:
        assert mask is not None  # fine-tuning caches hold a mask
        return PaddedRecords(tokens, mask, offsets, seq_len, pad_id=pad_id)
    windows = PackedTokens(tokens, seq_len, mask, pad_id=pad_id)
    how = "data.packing=concat" if cfg.packing == CONCAT else "documents concatenated"
    windows.packing = concatenated(how, len(offsets) - 1, len(tokens), len(windows), seq_len)
    return DocumentWindows(windows, offsets) if cfg.document_masks else windows
