"""The global-batch sampler: which samples make up optimizer step k, and who takes which.

The rule: step k's global batch is positions k*G .. k*G+G-1 of one endless sample order, where
G = batch.global_size. For an unbounded (generated) dataset the order is the identity; for a
dataset of N samples it is epoch after epoch of a permutation of 0..N-1 drawn from (seed, epoch).
So the samples of step k depend on the seed, k and G only, never on dp, micro size or
accumulation. Rank r then takes the r-th contiguous slice of dp equal slices, and its micro-batch
m the m-th contiguous slice of that. Any fixed slicing gives the same step, because the loss is
the mean over all valid tokens of the whole global batch.
"""

from __future__ import annotations

import torch

from launcher.config.batch import BatchSplit


class GlobalBatchSampler:
    def __init__(self, dataset_len: int, global_size: int, seed: int) -> None:
        self.n = dataset_len
        self.global_size = global_size
        self.seed = seed
        self._epoch = -1
        self._perm: list[int] = []

    def _position(self, p: int) -> int:
        if self.n == 0:
            return p
        epoch, offset = divmod(p, self.n)
        if epoch != self._epoch:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._perm = torch.randperm(self.n, generator=g).tolist()
            self._epoch = epoch
        return self._perm[offset]

    def global_batch(self, step: int) -> list[int]:
        """Sample indices of optimizer step `step` (0-based), the same for every split."""
        start = step * self.global_size
        return [self._position(p) for p in range(start, start + self.global_size)]

    def micro_batches(self, step: int, split: BatchSplit, rank: int) -> list[list[int]]:
        """This rank's grad_accum micro-batches of micro_size indices each."""
        assert split.global_size == self.global_size
        mine = self.global_batch(step)[rank * split.per_rank : (rank + 1) * split.per_rank]
        m = split.micro_size
        return [mine[i * m : (i + 1) * m] for i in range(split.grad_accum)]
