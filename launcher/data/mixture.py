"""A `data.sources` mixture as one dataset: the sources' samples side by side (source s holds
indices offsets[s] .. offsets[s] + len(source) - 1), with their names and asked weights; the
sampler (launcher/data/sampler.py) picks which source each sample of a global batch comes from."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from launcher.data.sequence import Sample, TokenDataset


class MixtureDataset:
    def __init__(
        self, names: Sequence[str], weights: Sequence[float], datasets: Sequence[TokenDataset]
    ) -> None:
        self.names, self.datasets = tuple(names), list(datasets)
        total = float(sum(weights))
        self.weights = tuple(float(w) / total for w in weights)
        """The asked weights, normalised to sum to 1."""
        self.lengths = [len(d) for d in self.datasets]
        self.offsets = np.cumsum([0, *self.lengths])

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def source_of(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        """The number of the source each index belongs to."""
        return np.searchsorted(self.offsets, np.asarray(indices), side="right") - 1

    def __getitem__(self, index: int) -> Sample:
        if not 0 <= index < len(self):
            raise IndexError(index)
        s = int(self.source_of([index])[0])
        return self.datasets[s][index - int(self.offsets[s])]

    def eval_problems(self) -> list[tuple[bytes, bytes]]:
        return []

    def report(self, tokens: dict[str, int]) -> dict[str, dict[str, Any]]:
        """summary.json's `mixture`: per source its asked weight, the valid target tokens it
        gave (`tokens`, the run's totals by name) and its realised fraction of them all."""
        total = sum(tokens.values())
        return {
            name: {
                "weight": weight,
                "tokens": tokens.get(name, 0),
                "fraction": tokens.get(name, 0) / total if total else None,
                "samples": length,
            }
            for name, weight, length in zip(self.names, self.weights, self.lengths, strict=True)
        }
