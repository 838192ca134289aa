"""data=tokens and data=custom: windows, held-out splits, clear errors, flat memory (issue 13)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from launcher.config.batch import resolve_batch
from launcher.config.data import DataConfig, DataKind, TokenDtype
from launcher.data import IGNORE_INDEX
from launcher.data.build import build_datasets
from launcher.data.sampler import GlobalBatchSampler
from launcher.data.sequence import collate
from launcher.errors import DataError, LauncherError
from launcher.training.evaluation import eval_chunks
from tests.data_sources import write_tokens

SEQ = 8


def tokens_cfg(path: Path, **kw: object) -> DataConfig:
    return DataConfig(name=DataKind.tokens, path=str(path), **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("dtype", ["uint16", "uint32"])
def test_windows_are_seq_len_plus_one_shifted(tmp_path: Path, dtype: str) -> None:
    path = tmp_path / "train.bin"
    np.arange(45, dtype=dtype).tofile(path)  # 45 tokens: 44 targets -> 6 windows, last padded
    ds = build_datasets(tokens_cfg(path, dtype=TokenDtype(dtype)), SEQ, 0, 256).train
    assert len(ds) == 6
    assert ds[1].input_ids.tolist() == list(range(8, 16))
    assert ds[1].targets.tolist() == list(range(9, 17))
    last = ds[5]
    assert last.input_ids[:4].tolist() == [40, 41, 42, 43]
    assert last.targets.tolist() == [41, 42, 43, 44] + [IGNORE_INDEX] * 4
    covered = [t for i in range(len(ds)) for t in ds[i].targets.tolist() if t != IGNORE_INDEX]
    assert covered == list(range(1, 45))  # every token but the first is a target exactly once


def test_val_path_and_holdout(tmp_path: Path) -> None:
    train = write_tokens(tmp_path / "train.bin", 8 * 10 + 1)
    val = write_tokens(tmp_path / "val.bin", 8 * 3 + 1, seed=1)
    both = build_datasets(tokens_cfg(train, val_path=str(val)), SEQ, 0, 256)
    assert len(both.train) == 10 and both.val is not None and len(both.val) == 3
    held = build_datasets(tokens_cfg(train, holdout=2), SEQ, 0, 256)
    assert len(held.train) == 8 and held.val is not None and len(held.val) == 2
    whole = build_datasets(tokens_cfg(train), SEQ, 0, 256).train
    assert torch.equal(held.val[1].input_ids, whole[9].input_ids)
    with pytest.raises(DataError, match=r"data.holdout"):
        build_datasets(tokens_cfg(train, holdout=10), SEQ, 0, 256)


def test_bad_token_files_name_the_key_file_and_fix(tmp_path: Path) -> None:
    odd = tmp_path / "odd.bin"
    odd.write_bytes(b"\x00" * 101)
    with pytest.raises(DataError) as info:
        build_datasets(tokens_cfg(odd), SEQ, 0, 256)
    assert "data.path" in str(info.value) and str(odd) in str(info.value)
    assert "not a multiple of 2" in str(info.value) and "Fix:" in str(info.value)
    assert "uint32" not in str(info.value)  # 101 bytes are no uint32 file either
    six = tmp_path / "six.bin"
    six.write_bytes(b"\x00" * 6)  # three uint16 tokens, read as uint32
    with pytest.raises(DataError, match=r"data\.dtype=uint16"):
        build_datasets(tokens_cfg(six, dtype="uint32"), SEQ, 0, 256)
    big = tmp_path / "big.bin"
    ids = np.zeros(100, dtype=np.uint16)
    ids[77] = 300
    ids.tofile(big)
    with pytest.raises(DataError) as info:
        build_datasets(tokens_cfg(big), SEQ, 0, 256)
    text = str(info.value)
    assert "token id 300" in text and "token 77" in text and "model.vocab_size=301" in text
    with pytest.raises(DataError, match=r"data.val_path: no such file"):
        build_datasets(tokens_cfg(big, val_path=str(tmp_path / "nope.bin")), SEQ, 0, 512)
    with pytest.raises(DataError, match=r"data.path: no such file"):
        build_datasets(tokens_cfg(tmp_path / "missing.bin"), SEQ, 0, 256)


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_a_large_file_is_mapped_not_read(tmp_path: Path) -> None:
    """256 MiB sparse file: opening, the vocabulary scan and reading windows keep memory flat
    (the scan's chunk buffers, about 16 MiB, are the only growth allowed)."""
    size = 256 << 20
    path = tmp_path / "large.bin"
    with open(path, "wb") as f:
        f.truncate(size)
    before = rss_bytes()
    ds = build_datasets(tokens_cfg(path), 1024, 0, 256).train
    assert len(ds) == -(-(size // 2 - 1) // 1024)
    for i in (0, len(ds) // 2, len(ds) - 1):
        assert int(ds[i].targets.ne(IGNORE_INDEX).sum()) > 0
    assert rss_bytes() - before < size // 4


def test_step_k_is_the_same_samples_for_every_split_and_epochs_cover(tmp_path: Path) -> None:
    path = write_tokens(tmp_path / "train.bin", SEQ * 21 + 1)
    ds = build_datasets(tokens_cfg(path), SEQ, 0, 256).train
    n, global_size = len(ds), 8
    sampler = GlobalBatchSampler(n, global_size, seed=5)
    for step in (0, 3):
        whole = collate([ds[i] for i in sampler.global_batch(step)])
        for dp, micro in ((1, 8), (2, 2), (4, 1), (2, 4)):
            split = resolve_batch(global_size, micro, None, dp)
            pieces = [
                collate([ds[i] for i in mb])
                for r in range(dp)
                for mb in sampler.micro_batches(step, split, r)
            ]
            assert torch.equal(torch.cat([p[0] for p in pieces]), whole[0])
            assert torch.equal(torch.cat([p[1] for p in pieces]), whole[1])
    order = [i for step in range(-(-2 * n // global_size)) for i in sampler.global_batch(step)]
    assert sorted(order[:n]) == list(range(n)) and sorted(order[n : 2 * n]) == list(range(n))


def custom_cfg(target: str = "tests.data_sources.make_dataset", **args: object) -> DataConfig:
    return DataConfig(name=DataKind.custom, _target_=target, args=dict(args))


def test_custom_dataset_by_target() -> None:
    data = build_datasets(custom_cfg(size=30, seq_len=SEQ), SEQ, 0, 256)
    assert len(data.train) == 30 and data.val is None
    sample = data.train[4]
    assert sample.input_ids.shape == (SEQ,) and sample.targets[0] == IGNORE_INDEX
    held = build_datasets(DataConfig(**{**custom_cfg(size=30).__dict__, "holdout": 6}), SEQ, 0)
    assert len(held.train) == 24 and held.val is not None and len(held.val) == 6
    sampler = GlobalBatchSampler(len(held.train), 8, seed=0)
    epoch = [i for s in range(3) for i in sampler.global_batch(s)]
    assert sorted(epoch) == list(range(24))  # three steps of 8: one epoch, nothing repeated


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("tests.data_sources.no_such_function", "does not import"),
        ("no_such_package.make", "run launch from the directory that holds no_such_package/"),
        ("tests.data_sources.not_a_mapping", '"input_ids" and "labels"'),
    ],
)
def test_custom_dataset_errors(target: str, message: str) -> None:
    with pytest.raises(LauncherError) as info:
        build_datasets(custom_cfg(target), SEQ, 0)
    assert "data._target_" in str(info.value) and message in str(info.value)


def test_eval_chunks_deal_every_held_out_sample_once_with_equal_counts() -> None:
    for n, dp, micro in ((10, 2, 2), (7, 4, 1), (3, 4, 2), (16, 2, 8)):
        chunks = [eval_chunks(n, dp, micro, r) for r in range(dp)]
        assert len({len(c) for c in chunks}) == 1
        dealt = sorted(i for c in chunks for mb in c for i in mb)
        assert dealt == list(range(n))


def test_a_file_shorter_than_one_window_is_refused(tmp_path: Path) -> None:
    """Found by the new-user probe: a 10-token file with seq_len 24 trained one padded window
    over and over, silently."""
    short = tmp_path / "short.bin"
    np.arange(10, dtype=np.uint16).tofile(short)
    with pytest.raises(DataError) as info:
        build_datasets(tokens_cfg(short), 24, 0, 256)
    text = str(info.value)
    assert "data.path" in text and "10 tokens" in text and "model.seq_len" in text
