"""What rank 0 says about small data (launcher/data/notes.py): a global batch larger than an
epoch, with the numbers; how many records went into how many windows, and the fill."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from launcher.config.batch import resolve_batch
from launcher.data.heldout import hold_out
from launcher.data.mixture import MixtureDataset
from launcher.data.notes import concatenated, data_notes, epoch_warning, packing_of
from launcher.data.packed import DocumentWindows, PackedRecords
from launcher.data.packing import packed_layout
from launcher.data.tokens import PackedTokens
from tests.data_sources import make_dataset


@pytest.mark.parametrize(
    ("samples", "global_size", "said"),
    [
        (12, 32, "12 samples: each step sees every one 2.67 times on average"),
        (16, 32, "16 samples: each step sees every one exactly 2 times"),
        (31, 32, "31 samples: each step sees every one 1.03 times on average"),
    ],
)
def test_a_global_batch_past_an_epoch_is_a_warning_with_the_numbers(
    samples: int, global_size: int, said: str
) -> None:
    warning = epoch_warning(samples, global_size)
    assert warning is not None
    assert f"the global batch of {global_size} sequences is larger than an epoch" in warning
    assert said in warning and f"set batch.global_size={samples} (the largest" in warning


@pytest.mark.parametrize(
    ("micro_size", "grad_accum", "dp"),
    [(None, None, 2), (None, None, 8), (4, None, 2), (None, 3, 2), (2, 4, 2), (None, None, 1)],
)
def test_the_smaller_batch_the_warning_names_splits_as_set(
    micro_size: int | None, grad_accum: int | None, dp: int
) -> None:
    # 195 samples under a global batch of 256: the Fix's batch is at most the epoch and passes the
    # batch arithmetic with the other settings as the run set them (195 itself is refused on dp=2).
    warning = epoch_warning(195, 256, as_set=(micro_size, grad_accum, dp))
    assert warning is not None
    fix = re.search(r"Fix: set (\S+=\d+)( batch.grad_accum=null)?", warning)
    assert fix is not None, warning
    size = int(fix.group(1).removeprefix("batch.global_size="))
    accum = None if fix.group(2) else grad_accum
    assert 0 < size <= 195
    assert resolve_batch(size, micro_size, accum, dp).global_size == size


def test_an_epoch_smaller_than_one_split_only_asks_for_more_data() -> None:
    warning = epoch_warning(5, 32, as_set=(4, None, 2))  # 8 is the least global batch
    assert warning is not None and warning.endswith("Fix: use more data.")


@pytest.mark.parametrize(("samples", "global_size"), [(32, 32), (100, 32), (0, 32)])
def test_a_batch_within_an_epoch_or_unbounded_data_is_quiet(samples: int, global_size: int) -> None:
    assert epoch_warning(samples, global_size) is None


def records(tmp_path: Path, lengths: list[int], seq_len: int = 8) -> PackedRecords:
    offsets = np.cumsum([0, *lengths]).astype(np.int64)
    tokens = np.arange(offsets[-1], dtype=np.uint32) % 50
    tmp_path.mkdir()
    layout = packed_layout(tmp_path, offsets, seq_len)
    return PackedRecords(tokens, None, offsets, layout, seq_len, pad_id=0)


def test_records_packed_whole_give_their_windows_and_fill(tmp_path: Path) -> None:
    # 16 records of 5 tokens take 4 positions each: two to a window of 8, 8 windows, all full;
    # one of 3 tokens (2 positions) opens a 9th; one of 1 token has nothing to train, no window.
    full = records(tmp_path / "a", [5] * 16)
    assert len(full) == 8
    facts = packing_of(full)
    assert facts is not None and (facts.records, facts.windows, facts.fill) == (16, 8, 1.0)
    more = records(tmp_path / "b", [5] * 16 + [3, 1])
    facts = packing_of(more)
    assert facts is not None and (facts.records, facts.windows) == (17, 9)
    assert facts.fill == pytest.approx(66 / 72)
    assert facts.describe() == (
        "data.packing=true: 17 records went into 9 windows of 8 positions, fill 91.7% (the rest "
        "is padding)"
    )
    notes, warnings = data_notes(more, global_size=16)
    assert notes == [facts.describe()]
    assert (
        len(warnings) == 1
        and "an epoch of the data, 9 windows (17 records packed)" in (warnings[0])
    )


def test_concatenated_records_and_a_held_out_slice(tmp_path: Path) -> None:
    # 100 tokens in 10 records: 99 inputs in ceil(99 / 8) = 13 windows of 8 positions.
    windows = PackedTokens(np.arange(100, dtype=np.uint32), 8)
    windows.packing = concatenated("data.packing=concat", 10, 100, len(windows), 8)
    dataset = DocumentWindows(windows, np.arange(0, 100, 10, dtype=np.int64))
    train, _ = hold_out(dataset, 3, "data=hf")  # the training set is a slice of the windows
    facts = packing_of(train)
    assert facts is not None and (facts.records, facts.windows) == (10, 13)
    assert facts.fill == pytest.approx(99 / 104)
    notes, warnings = data_notes(train, global_size=16)
    assert notes == [facts.describe()] and "an epoch of the data, 10 windows" in warnings[0]
    assert data_notes(make_dataset(size=64), global_size=16) == ([], [])  # nothing packed


def test_a_mixture_names_the_sources_whose_share_is_past_their_epoch() -> None:
    mixture = MixtureDataset(["small", "big"], [3, 1], [make_dataset(4), make_dataset(100)])
    notes, warnings = data_notes(mixture, global_size=32)
    assert notes == [] and len(warnings) == 1
    assert "source 'small': about 24.0 sequences a step from an epoch of 4 samples" in warnings[0]
    assert "6.00 times per step" in warnings[0] and "'big'" not in warnings[0]
    assert data_notes(mixture, global_size=4) == ([], [])
