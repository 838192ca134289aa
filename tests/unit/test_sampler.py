"""The global batch of a step depends on the seed, the step and the global size only."""

from __future__ import annotations

import pytest

from launcher.config.batch import resolve_batch
from launcher.data.sampler import GlobalBatchSampler

SPLITS = [(1, None, 1), (1, 4, None), (2, 2, None), (4, 1, None), (2, None, 4), (8, None, None)]


@pytest.mark.parametrize("dataset_len", [0, 37, 1000])
def test_union_of_slices_is_the_global_batch_for_every_split(dataset_len: int) -> None:
    global_size = 16
    sampler = GlobalBatchSampler(dataset_len, global_size, seed=3)
    for step in (0, 1, 5):
        reference = sampler.global_batch(step)
        for dp, micro, accum in SPLITS:
            split = resolve_batch(global_size, micro, accum, dp)
            taken = [
                index
                for rank in range(dp)
                for micro_batch in sampler.micro_batches(step, split, rank)
                for index in micro_batch
            ]
            assert taken == reference
            sizes = {len(mb) for r in range(dp) for mb in sampler.micro_batches(step, split, r)}
            assert sizes == {split.micro_size}


def test_depends_on_seed_and_step() -> None:
    a = GlobalBatchSampler(1000, 8, seed=0)
    b = GlobalBatchSampler(1000, 8, seed=1)
    assert a.global_batch(0) != b.global_batch(0)
    assert a.global_batch(0) != a.global_batch(1)
    assert a.global_batch(3) == GlobalBatchSampler(1000, 8, seed=0).global_batch(3)


def test_finite_dataset_visits_every_sample_once_per_epoch() -> None:
    sampler = GlobalBatchSampler(24, 8, seed=5)
    epoch = [i for step in range(3) for i in sampler.global_batch(step)]
    assert sorted(epoch) == list(range(24))
    assert epoch != list(range(24))  # shuffled
    next_epoch = [i for step in range(3, 6) for i in sampler.global_batch(step)]
    assert sorted(next_epoch) == list(range(24)) and next_epoch != epoch
