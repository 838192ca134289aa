"""Batch arithmetic: every derivation and every error."""

from __future__ import annotations

import pytest

from launcher.config.batch import MAX_GLOBAL_SIZE, BatchSplit, divisors, resolve_batch
from launcher.errors import ConfigError


@pytest.mark.parametrize(
    ("given", "dp", "expected"),
    [
        ((32, None, None), 1, BatchSplit(32, 32, 1, 1)),  # global alone: accum 1
        ((32, None, None), 4, BatchSplit(32, 8, 1, 4)),
        ((32, 4, None), 1, BatchSplit(32, 4, 8, 1)),  # global + micro -> accum
        ((32, 4, None), 2, BatchSplit(32, 4, 4, 2)),
        ((32, None, 4), 2, BatchSplit(32, 4, 4, 2)),  # global + accum -> micro
        ((None, 4, 3), 2, BatchSplit(24, 4, 3, 2)),  # micro + accum -> global
        ((None, 4, None), 2, BatchSplit(8, 4, 1, 2)),  # micro alone: accum 1
        ((24, 4, 3), 2, BatchSplit(24, 4, 3, 2)),  # all three, consistent
    ],
)
def test_derivations(given: tuple, dp: int, expected: BatchSplit) -> None:
    split = resolve_batch(*given, dp=dp)
    assert split == expected
    assert split.micro_size * split.grad_accum * split.dp == split.global_size


def _error(given: tuple, dp: int) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        resolve_batch(*given, dp=dp)
    return info.value


def test_micro_does_not_divide_names_keys_and_suggests() -> None:
    err = _error((10, 3, None), 1)
    assert err.keys == ["batch.global_size", "batch.micro_size"]
    assert "1, 2, 5, 10" in str(err)  # valid micro sizes
    assert "9, 12" in str(err)  # nearby valid global sizes


def test_global_not_divisible_by_dp() -> None:
    err = _error((10, None, None), 4)
    assert err.keys == ["batch.global_size", "parallel.dp"]
    assert "8, 12" in str(err)


def test_accum_does_not_divide() -> None:
    err = _error((16, None, 3), 2)
    assert "batch.grad_accum" in err.keys
    assert "1, 2, 4, 8" in str(err)


def test_inconsistent_triple_names_all_keys() -> None:
    err = _error((32, 4, 2), 2)
    assert set(err.keys) == {
        "batch.global_size",
        "batch.micro_size",
        "batch.grad_accum",
        "parallel.dp",
    }
    assert "16, not 32" in str(err)


def test_nothing_set() -> None:
    err = _error((None, None, 4), 1)
    assert "batch.global_size" in err.keys


def test_bad_dp() -> None:
    assert "parallel.dp" in _error((8, None, None), 0).keys


def test_divisors_of_a_huge_batch_are_found_quickly_and_completely() -> None:
    assert divisors(36) == [1, 2, 3, 4, 6, 9, 12, 18, 36]
    assert divisors(97) == [1, 97]
    big = 2**20 * 3**5 * 5  # a large per-rank batch: a million trial divisions, not 10**9
    assert divisors(big) == [d for d in range(1, 2**20 + 1) if big % d == 0] + [
        big // d for d in reversed(range(1, 2**20 + 1)) if big % d == 0 and big // d > 2**20
    ]


def test_a_global_batch_beyond_any_run_is_refused_as_a_typo() -> None:
    resolve_batch(MAX_GLOBAL_SIZE, None, None, 1)  # the limit itself plans
    err = _error((999999999999999989, 2, None), 1)
    assert err.keys == ["batch.global_size"] and "typo" in str(err)
