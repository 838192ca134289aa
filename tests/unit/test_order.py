"""The computed sample order (data.order=feistel): a bijection of [0, N) per epoch, keyed by
(seed, epoch), in kilobytes at any N; the randperm order of earlier runs kept as it was."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.data.order import FeistelOrder, RandpermOrder
from launcher.data.sampler import GlobalBatchSampler

SMALL_N = [1, 2, 3, 4, 5, 7, 8, 16, 31, 97, 128, 257, 1000]


@pytest.mark.parametrize("n", SMALL_N)
def test_every_sample_exactly_once_per_epoch(n: int) -> None:
    for seed in (0, 1, 12345):
        order = FeistelOrder(n, seed)
        epochs = [order.samples(np.arange(e * n, (e + 1) * n)) for e in range(3)]
        for epoch in epochs:
            assert sorted(epoch.tolist()) == list(range(n))
        if n >= 8:  # shuffled, and each epoch its own shuffle
            assert epochs[0].tolist() != list(range(n))
            assert epochs[0].tolist() != epochs[1].tolist()


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 5000), seed=st.integers(-(2**40), 2**40), epoch=st.integers(0, 10**6))
def test_property_a_bijection_for_any_n_seed_and_epoch(n: int, seed: int, epoch: int) -> None:
    perm = FeistelOrder(n, seed).permute(np.arange(n), epoch)
    assert np.array_equal(np.sort(perm), np.arange(n))


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 3000), start=st.integers(0, 10**4), size=st.integers(1, 300))
def test_property_any_window_of_positions_is_the_same_however_it_is_asked(
    n: int, start: int, size: int
) -> None:
    """Positions are computed one by one: a window straddling epochs equals its parts."""
    order = FeistelOrder(n, 7)
    whole = order.samples(np.arange(start, start + size))
    parts = [int(order.samples(np.array([p]))[0]) for p in range(start, start + size)]
    assert whole.tolist() == parts


def test_keyed_by_seed_epoch_and_stream() -> None:
    n = 1000
    first = FeistelOrder(n, 0).permute(np.arange(n), 0).tolist()
    assert first == FeistelOrder(n, 0).permute(np.arange(n), 0).tolist()  # deterministic
    assert first != FeistelOrder(n, 1).permute(np.arange(n), 0).tolist()
    assert first != FeistelOrder(n, 0).permute(np.arange(n), 1).tolist()
    assert first != FeistelOrder(n, 0, "web").permute(np.arange(n), 0).tolist()


def test_kilobytes_at_a_billion_samples() -> None:
    order = FeistelOrder(10**9, 3)
    batch = order.samples(np.arange(10**9 - 2048, 10**9 + 2048))  # straddles two epochs
    assert len(set(batch[:2048].tolist())) == 2048 and batch.min() >= 0 and batch.max() < 10**9
    held = sys.getsizeof(order.__dict__) + sum(k.nbytes for k in order._keys.values())
    assert held < 4096


def test_randperm_order_is_the_earlier_one_bitwise() -> None:
    """data.order=randperm gives exactly the order of runs before orders were recorded."""
    n, seed = 37, 5
    old = []
    for epoch in range(3):
        g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
        old += torch.randperm(n, generator=g).tolist()
    sampler = GlobalBatchSampler(n, 8, seed, order="randperm")
    got = [i for step in range(len(old) // 8) for i in sampler.global_batch(step)]
    assert got == old[: len(got)]
    assert RandpermOrder(n, seed).samples(np.arange(5)).tolist() == old[:5]
