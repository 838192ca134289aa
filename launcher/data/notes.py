"""What rank 0 says about the training data at the start of a run, so that small data is never
silent (docs/data.md#small-data):

- a packed run: how many records went into how many windows of model.seq_len positions, and the
  fill (the fraction of the windows' positions that hold a record's token, the rest padding);
- a global batch larger than an epoch: a warning with the samples of an epoch, the global batch
  and how often each sample is seen in one step (every step holds batch.global_size samples of
  one endless order, epoch after epoch: launcher/data/sampler.py), since a sample repeated inside
  a step weighs more in that step's loss. A mixture's source (data.sources) is checked against
  its share of the global batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from launcher.config.batch import BatchSplit, smaller_global
from launcher.data.heldout import Slice
from launcher.data.mixture import MixtureDataset
from launcher.logs import get_logger

log = get_logger("data")


@dataclass(frozen=True)
class PackingFacts:
    """How a cache's records were laid into windows."""

    how: str
    """How, in words: `data.packing=true` (records whole), `data.packing=concat` (concatenated,
    cut at the windows' ends), or `documents concatenated` (pretraining's records)."""
    records: int
    windows: int
    seq_len: int
    real: int
    """Positions of all windows that hold a record's token (inputs), not padding."""

    @property
    def fill(self) -> float:
        return self.real / (self.windows * self.seq_len) if self.windows else 0.0

    def describe(self) -> str:
        return (
            f"{self.how}: {self.records:,} records went into {self.windows:,} windows of "
            f"{self.seq_len} positions, fill {self.fill:.1%} (the rest is padding)"
        )


def whole_records(positions: np.ndarray, starts: np.ndarray, seq_len: int) -> PackingFacts:
    """data.packing=true: each record's positions (launcher/data/packing.py) in len(starts) - 1
    windows; a record of one token takes none and goes in no window."""
    return PackingFacts(
        "data.packing=true",
        int((positions > 0).sum()),
        len(starts) - 1,
        seq_len,
        int(positions.sum()),
    )


def concatenated(how: str, records: int, tokens: int, windows: int, seq_len: int) -> PackingFacts:
    """Records concatenated and cut into windows: every token but the last is an input."""
    return PackingFacts(how, records, windows, seq_len, max(tokens - 1, 0))


def packing_of(dataset: Any) -> PackingFacts | None:
    """The packing of a dataset (through a held-out slice), None when it packs nothing."""
    while isinstance(dataset, Slice):
        dataset = dataset.base
    facts = getattr(dataset, "packing", None)
    return facts if isinstance(facts, PackingFacts) else None


def times_seen(global_size: int, samples: int) -> str:
    """How often a step sees each of `samples` samples: exactly, or on average."""
    if global_size % samples == 0:
        return f"exactly {global_size // samples} times"
    return f"{global_size / samples:.2f} times on average"


def epoch_warning(
    samples: int,
    global_size: int,
    unit: str = "samples",
    as_set: tuple[int | None, int | None, int] = (None, None, 1),
) -> str | None:
    """A global batch larger than an epoch of `samples` (0: unbounded, generated data), or None.
    as_set: (batch.micro_size, batch.grad_accum, parallel.dp) as the run set them, so that the
    smaller batch the Fix names splits over the ranks (launcher/config/batch.py)."""
    if not 0 < samples < global_size:
        return None
    smaller = smaller_global(samples, *as_set)
    fix = (
        "use more data"
        if smaller is None
        else f"set {smaller[0]} (the largest batch within an epoch that is {smaller[1]}), or "
        "use more data"
    )
    return (
        f"the global batch of {global_size} sequences is larger than an epoch of the data, "
        f"{samples:,} {unit}: each step sees every one {times_seen(global_size, samples)}, so "
        f"samples repeat inside one step and weigh more in its loss. Fix: {fix}."
    )


def mixture_warning(mixture: MixtureDataset, global_size: int) -> str | None:
    """The sources whose share of a global batch is larger than their own epoch."""
    small = [
        (name, weight * global_size, length)
        for name, weight, length in zip(
            mixture.names, mixture.weights, mixture.lengths, strict=True
        )
        if 0 < length < weight * global_size
    ]
    if not small:
        return None
    each = "; ".join(
        f"source {name!r}: about {share:.1f} sequences a step from an epoch of {length:,} "
        f"samples, each seen {share / length:.2f} times per step on average"
        for name, share, length in small
    )
    return (
        f"the global batch of {global_size} sequences takes more from a source than its epoch "
        f"holds ({each}), so its samples repeat inside one step. Fix: lower batch.global_size, "
        "lower those sources' data.sources weights, or give them more data."
    )


def data_notes(
    dataset: Any, global_size: int, as_set: tuple[int | None, int | None, int] = (None, None, 1)
) -> tuple[list[str], list[str]]:
    """(information, warnings) about the training set for a global batch of global_size; as_set:
    (batch.micro_size, batch.grad_accum, parallel.dp) as set (epoch_warning)."""
    notes, warnings = [], []
    if isinstance(dataset, MixtureDataset):
        for name, source in zip(dataset.names, dataset.datasets, strict=True):
            facts = packing_of(source)
            if facts is not None:
                notes.append(f"source {name!r}: {facts.describe()}")
        warning = mixture_warning(dataset, global_size)
    else:
        facts = packing_of(dataset)
        if facts is not None:
            notes.append(facts.describe())
        unit = "samples" if facts is None else f"windows ({facts.records:,} records packed)"
        warning = epoch_warning(len(dataset), global_size, unit, as_set)
    if warning is not None:
        warnings.append(warning)
    return notes, warnings


def announce_data(
    dataset: Any, split: BatchSplit, micro_size: int | None, grad_accum: int | None
) -> None:
    """Rank 0, once at start: the packing as information, a global batch past an epoch as a
    warning (micro_size, grad_accum: batch.* as set, None where derived)."""
    as_set = (micro_size, grad_accum, split.dp)
    notes, warnings = data_notes(dataset, split.global_size, as_set)
    for note in notes:
        log.info(note)
    for warning in warnings:
        log.warning(warning)
