"""The global-batch sampler: which samples make up optimizer step k, and who takes which.

The rule: step k's global batch is positions k*G .. k*G+G-1 of one endless sample order, where
G = batch.global_size. For an unbounded (generated) dataset the order is the identity; for a
dataset of N samples it is epoch after epoch of a permutation of 0..N-1 keyed by (seed, epoch)
(launcher/data/order.py: computed per position, data.order=feistel; or the stored randperm of
earlier runs). For a `data.sources` mixture, the mixture's schedule (launcher/data/schedule.py)
first sends each position to a source and to a position of that source's own endless order, so
each source epochs on its own. So the samples of step k depend on the seed, k and G only, never
on dp, micro size or accumulation. Rank r then takes the r-th contiguous slice of dp equal
slices, and its micro-batch m the m-th contiguous slice of that. Any fixed slicing gives the same
step, because the loss is the mean over all valid tokens of the whole global batch.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from launcher.config.batch import BatchSplit
from launcher.data.mixture import MixtureDataset
from launcher.data.order import ORDERS, FeistelOrder
from launcher.data.schedule import MixtureSchedule


class GlobalBatchSampler:
    def __init__(
        self, dataset_len: int, global_size: int, seed: int, order: str = "feistel"
    ) -> None:
        self.n = dataset_len
        self.global_size = global_size
        self.seed = seed
        self.order: Any = ORDERS[order](dataset_len, seed) if dataset_len else None

    def positions(self, step: int) -> np.ndarray:
        start = step * self.global_size
        return np.arange(start, start + self.global_size, dtype=np.int64)

    def batch_array(self, step: int) -> np.ndarray:
        """Sample indices of optimizer step `step` (0-based) as an int64 array."""
        positions = self.positions(step)
        return positions if self.order is None else self.order.samples(positions)

    def global_batch(self, step: int) -> list[int]:
        """Sample indices of optimizer step `step` (0-based), the same for every split."""
        return self.batch_array(step).tolist()

    def micro_batches(self, step: int, split: BatchSplit, rank: int) -> list[list[int]]:
        """This rank's grad_accum micro-batches of micro_size indices each."""
        assert split.global_size == self.global_size
        mine = self.global_batch(step)[rank * split.per_rank : (rank + 1) * split.per_rank]
        m = split.micro_size
        return [mine[i * m : (i + 1) * m] for i in range(split.grad_accum)]


class MixtureSampler(GlobalBatchSampler):
    """A mixture's global batches: each position routed to a source by the schedule, then drawn
    from that source's own order (keyed by the seed and the source's name)."""

    def __init__(self, mixture: MixtureDataset, global_size: int, seed: int) -> None:
        super().__init__(0, global_size, seed)
        self.n = len(mixture)
        self.schedule = MixtureSchedule(mixture.weights)
        self.orders = [
            FeistelOrder(n, seed, name)
            for n, name in zip(mixture.lengths, mixture.names, strict=True)
        ]
        self.offsets = mixture.offsets

    def batch_array(self, step: int) -> np.ndarray:
        source, index = self.schedule.route(self.positions(step))
        out = np.empty_like(index)
        for s, order in enumerate(self.orders):
            mine = source == s
            if mine.any():
                out[mine] = self.offsets[s] + order.samples(index[mine])
        return out


def sampler_for(dataset: Any, global_size: int, seed: int, order: str) -> GlobalBatchSampler:
    """The sampler of a training set: a mixture's, or one order over [0, len(dataset))."""
    if isinstance(dataset, MixtureDataset):
        return MixtureSampler(dataset, global_size, seed)
    return GlobalBatchSampler(len(dataset), global_size, seed, order)
