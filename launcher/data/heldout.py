"""Held-out samples: a contiguous slice of a dataset, and the last N samples kept for validation."""

from __future__ import annotations

from collections.abc import Sequence

from launcher.data.sequence import Sample, TokenDataset, encode_pair
from launcher.errors import DataError


class Slice:
    """Samples lo .. hi - 1 of another dataset, renumbered from 0."""

    def __init__(self, base: TokenDataset, lo: int, hi: int) -> None:
        self.base, self.lo, self.hi = base, lo, hi

    def __len__(self) -> int:
        return self.hi - self.lo

    def __getitem__(self, index: int) -> Sample:
        if not 0 <= index < len(self):
            raise IndexError(index)
        return self.base[self.lo + index]

    def eval_problems(self) -> list[tuple[bytes, bytes]]:
        return []


class Samples:
    """A fixed list of samples (validation sets built from held-out problems)."""

    def __init__(self, samples: Sequence[Sample]) -> None:
        self.samples = list(samples)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> Sample:
        return self.samples[index]

    def eval_problems(self) -> list[tuple[bytes, bytes]]:
        return []


def problems_as_samples(problems: list[tuple[bytes, bytes]], seq_len: int) -> Samples:
    return Samples([encode_pair(p, c, seq_len) for p, c in problems])


def hold_out(ds: TokenDataset, n: int, source: str) -> tuple[TokenDataset, TokenDataset | None]:
    """(training samples, the last n samples) of a finite dataset; (ds, None) for n = 0."""
    if n == 0:
        return ds, None
    total = len(ds)
    if total <= n:
        raise DataError(
            f"data.holdout: {source} has {total} samples, so holding out {n} leaves none to "
            f"train on. Fix: set data.holdout below {total}, or use data.val_path."
        )
    return Slice(ds, 0, total - n), Slice(ds, total - n, total)
