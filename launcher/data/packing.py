"""Where each record goes when records are packed whole (data.packing=true): best-fit decreasing
into windows of seq_len positions, computed once per cache and sequence length.

A record of L tokens takes min(L, seq_len + 1) - 1 positions (its inputs; its first token is
never a target). Records are taken longest first (ties: lower index first) and each goes into the
open window with the least room that still fits it, else a new window. Deterministic: the same
records and seq_len give the same layout on every machine, so the layout is a function of the data
identity (launcher/integrity) and model.seq_len, both recorded in every checkpoint; PLACEMENT names
the algorithm in the checkpoint's fingerprint, so a changed algorithm is never resumed silently.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import numpy as np

PLACEMENT = "best-fit-decreasing/1"
"""The placement algorithm's name and version (in the checkpoint fingerprint)."""


def record_positions(offsets: np.ndarray, seq_len: int) -> np.ndarray:
    """Positions each record takes in a window (0 for a record of one token: nothing to train)."""
    return np.minimum(np.diff(offsets), seq_len + 1).clip(min=1) - 1


def place(sizes: np.ndarray, capacity: int) -> tuple[np.ndarray, np.ndarray]:
    """Best-fit decreasing. Returns (order, starts): window w holds records
    order[starts[w]:starts[w + 1]], in record order."""
    windows: list[list[int]] = []
    by_room: dict[int, list[int]] = {}  # room left -> windows with that room
    rooms = 0  # bit r set: some window has exactly r positions left
    for index in np.argsort(-sizes, kind="stable").tolist():
        size = int(sizes[index])
        if size <= 0:
            continue
        fits = rooms >> size
        if fits:
            room = size + (fits & -fits).bit_length() - 1  # the least room that fits
            window = by_room[room].pop()
            if not by_room[room]:
                rooms &= ~(1 << room)
        else:
            room, window = capacity, len(windows)
            windows.append([])
        windows[window].append(index)
        left = room - size
        if left:
            by_room.setdefault(left, []).append(window)
            rooms |= 1 << left
    order = np.asarray([i for w in windows for i in sorted(w)], dtype=np.int64)
    starts = np.cumsum([0, *(len(w) for w in windows)], dtype=np.int64)
    return order, starts


def packed_layout(
    directory: Path, offsets: np.ndarray, seq_len: int
) -> tuple[np.ndarray, np.ndarray]:
    """The layout of a cache's records at seq_len, computed once and kept beside the cache
    (written whole under a temporary name, then renamed: a reader never sees half of it)."""
    path = directory / f"packed-{seq_len}.npz"
    if path.is_file() and not path.is_symlink():  # a link is not ours: computed, renamed over
        try:
            with np.load(path) as saved:
                return saved["order"], saved["starts"]
        except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError):
            pass  # unreadable (damaged): computed again and replaced below
    order, starts = place(record_positions(offsets, seq_len), seq_len)
    tmp = directory / f".packed-{seq_len}.tmp-{os.getpid()}.npz"
    np.savez(tmp, order=order, starts=starts)
    os.replace(tmp, path)  # the same content whoever wins a race
    return order, starts
