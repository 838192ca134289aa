"""The vocabulary check of a token file reads it whole once per file identity (issue 32): a later
launch on the same file only stats it; a file changed in size, time or inode is read again."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from launcher.errors import DataError, VocabTooSmall
from launcher.integrity import token_scan
from launcher.integrity.file_cache import cache_file
from launcher.integrity.token_scan import CACHE_FILE, max_token_id
from tests.data_sources import write_tokens
from tests.helpers import FAST, run_launch


def as_new_process() -> None:
    token_scan._seen.clear()  # only the cache file remembers


def reads_of(path: Path) -> int:
    return sum(1 for p in token_scan.scans if p == path)


def test_read_once_per_identity_and_again_when_changed(tmp_path: Path) -> None:
    path = write_tokens(tmp_path / "t.bin", 5000)
    ids = np.fromfile(path, dtype=np.uint16)
    expected = (int(ids.max()), int(ids.argmax()))
    assert max_token_id(path, "uint16") == expected and reads_of(path) == 1
    entry = json.loads(cache_file(CACHE_FILE).read_text())[f"{path.resolve()}:uint16"]
    st = path.stat()
    assert entry == [st.st_size, st.st_mtime_ns, st.st_ino, *expected]
    assert max_token_id(path, "uint16") == expected  # this process: no read, no cache file read
    as_new_process()
    assert max_token_id(path, "uint16") == expected and reads_of(path) == 1
    assert max_token_id(path, "uint32")[0] >= 0 and reads_of(path) == 2  # another dtype
    with open(path, "ab") as f:  # appended: another size
        np.asarray([255], dtype=np.uint16).tofile(f)
    as_new_process()
    assert max_token_id(path, "uint16")[0] == 255 and reads_of(path) == 3
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # touched: another mtime
    as_new_process()
    max_token_id(path, "uint16")
    assert reads_of(path) == 4
    as_new_process()
    max_token_id(path, "uint16")
    assert reads_of(path) == 4


def test_a_file_rewritten_with_a_bad_id_is_refused(tmp_path: Path) -> None:
    path = write_tokens(tmp_path / "t.bin", 1000, vocab=200)
    assert max_token_id(path, "uint16")[0] < 200
    bad = np.fromfile(path, dtype=np.uint16)
    bad[10] = 300
    other = tmp_path / "t.new"
    bad.tofile(other)
    other.replace(path)  # same size, another inode: read again, not trusted from the cache
    as_new_process()
    from launcher.data.tokens import check_vocab

    with pytest.raises(VocabTooSmall, match=r"token id 300 \(token 10\)"):
        check_vocab("data.path", path, "uint16", 256)


def test_a_damaged_cache_only_means_a_read(tmp_path: Path) -> None:
    path = write_tokens(tmp_path / "t.bin", 1000)
    cache_file(CACHE_FILE).parent.mkdir(parents=True, exist_ok=True)
    cache_file(CACHE_FILE).write_text("{not json")
    as_new_process()
    max_token_id(path, "uint16")
    assert reads_of(path) == 1
    as_new_process()
    max_token_id(path, "uint16")
    assert reads_of(path) == 1


def test_the_second_launch_does_not_read_the_file(tmp_path: Path) -> None:
    """`launch plan` checks the data before anything runs (launcher/prepare.py): the first launch
    on a file says it read it, the second says nothing and reads nothing; a bad id found by the
    first is still refused by the second."""
    path = write_tokens(tmp_path / "corpus.bin", 20_000)
    args = ["plan", *FAST, "data=tokens", f"data.path={path}"]
    first = run_launch(args, tmp_path / "a", in_process=True)
    assert "vocabulary check: read 20,000 tokens" in first.stdout
    as_new_process()
    second = run_launch(args, tmp_path / "b", in_process=True)
    assert "vocabulary check" not in second.stdout
    assert reads_of(path) == 1
    ids = np.fromfile(path, dtype=np.uint16)
    ids[7] = 999
    ids.tofile(path)  # written through: same inode and size, a newer mtime
    as_new_process()
    refused = run_launch(args, tmp_path / "c", in_process=True, check=False)
    assert refused.returncode != 0 and reads_of(path) == 2
    assert "token id 999" in refused.stderr and "model.vocab_size=1000" in refused.stderr
    as_new_process()
    again = run_launch(args, tmp_path / "d", in_process=True, check=False)
    assert again.returncode != 0 and "token id 999" in again.stderr and reads_of(path) == 2


def test_errors_are_unchanged_for_a_missing_file(tmp_path: Path) -> None:
    from launcher.config.data import DataConfig, DataKind
    from launcher.data.build import build_datasets

    cfg = DataConfig(name=DataKind.tokens, path=str(tmp_path / "missing.bin"))
    with pytest.raises(DataError, match=r"data.path: no such file"):
        build_datasets(cfg, 32, 0, 256)
