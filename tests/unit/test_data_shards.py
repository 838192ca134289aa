"""Shards (data.path as a list or glob), mixtures (data.sources) and the recorded sample order, in
one process: config errors name the key and the fix; every shard and source is in the data
identity; a mixture resumes exactly; a checkpoint from before orders were recorded resumes with
data.order=randperm (bitwise as before) and is refused with one clear line otherwise."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from launcher.checkpoint.files import find_checkpoints
from launcher.checkpoint.preflight import check_resume
from launcher.config import to_root_config
from launcher.data.build import absolute_paths, build_datasets
from launcher.data.mixture import MixtureDataset
from launcher.data.shards import ShardedTokens
from launcher.errors import ConfigError, DataError
from launcher.integrity.data import data_identity
from tests.data_sources import write_tokens
from tests.unit.test_resume_data_sources import (
    SEQ,
    STEPS,
    USER_MODEL,
    assert_exact_resume,
    config,
    ctx,
    launch,
    metrics,
)

__all__ = ["ctx"]  # a fixture


def shards(tmp_path: Path, sizes: tuple[int, ...] = (5, 3, 4)) -> list[Path]:
    (tmp_path / "shards").mkdir(exist_ok=True)
    return [
        write_tokens(tmp_path / "shards" / f"train-{i:05d}.bin", n * (SEQ + 1) + 1, seed=i)
        for i, n in enumerate(sizes)
    ]


def data_cfg(**data: Any) -> Any:
    return to_root_config({"data": {"name": "tokens", **data}, "model": {"seq_len": SEQ}}).data


def test_a_glob_and_a_list_are_one_corpus_whose_samples_stay_inside_their_shard(
    tmp_path: Path,
) -> None:
    files = shards(tmp_path)
    by_glob = build_datasets(data_cfg(path=str(tmp_path / "shards" / "train-*.bin")), SEQ, 0)
    by_list = build_datasets(data_cfg(path=[str(f) for f in files]), SEQ, 0)
    glob_ds, list_ds = by_glob.train, by_list.train
    assert isinstance(glob_ds, ShardedTokens) and isinstance(list_ds, ShardedTokens)
    # each shard of n windows of SEQ + 1 tokens (+ 1) is cut into n + 1 windows of SEQ
    assert len(glob_ds) == len(list_ds) == sum(len(s) for s in glob_ds.shards) == 6 + 4 + 5
    assert [str(s.tokens.filename) for s in glob_ds.shards] == [str(f) for f in files]  # sorted
    # The last window of a shard is padded: it never runs on into the next shard.
    first_len = len(glob_ds.shards[0])
    last = glob_ds[first_len - 1]
    assert int((last.targets == -100).sum()) > 0
    assert glob_ds[first_len].input_ids.tolist() == glob_ds.shards[1][0].input_ids.tolist()


@pytest.mark.parametrize(
    ("path", "said"),
    [
        ("nothing-*.bin", "the glob {d}/nothing-*.bin matches no file. Fix:"),
        (["shards/train-00000.bin", "shards/gone.bin"], "no such file: {d}/shards/gone.bin"),
        (["shards/train-00000.bin", "shards/train-00000.bin"], "is named twice. Fix:"),
    ],
)
def test_bad_shards_are_one_error_with_a_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: Any, said: str
) -> None:
    shards(tmp_path)
    monkeypatch.chdir(tmp_path)
    cfg = absolute_paths(data_cfg(path=path))
    with pytest.raises(DataError) as error:
        build_datasets(cfg, SEQ, 0)
    assert said.format(d=tmp_path) in str(error.value)


def test_a_shard_of_another_dtype_is_named(tmp_path: Path) -> None:
    files = shards(tmp_path)
    files[1].write_bytes(files[1].read_bytes()[:-1])  # an odd byte count: not uint16 tokens
    with pytest.raises(DataError, match=f"{files[1]} is .* not a multiple of 2"):
        build_datasets(data_cfg(path=[str(f) for f in files]), SEQ, 0)


@pytest.mark.parametrize(
    ("data", "key", "fix"),
    [
        ({"sources": [{"name": "a", "path": "a.bin", "weight": 0}]}, "data.sources[0].weight", ""),
        (
            {
                "sources": [
                    {"name": "a", "path": "a", "weight": 1},
                    {"name": "a", "path": "b", "weight": 1},
                ]
            },
            "data.sources[1].name",
            "give each source its own name",
        ),
        ({"sources": [{"name": "", "path": "a.bin", "weight": 1}]}, "data.sources[0].name", ""),
        ({"sources": [{"name": "a", "weight": 1}]}, "data.sources[0].path", ""),
        (
            {"path": "x.bin", "sources": [{"name": "a", "path": "a.bin", "weight": 1}]},
            "data.path",
            "drop data.path",
        ),
        (
            {"order": "randperm", "sources": [{"name": "a", "path": "a.bin", "weight": 1}]},
            "data.order",
            "drop data.order=randperm",
        ),
        ({"name": "text", "path": ["a.txt", "b.txt"]}, "data.path", "give one file"),
        ({"path": []}, "data.path", "needs a file"),
    ],
)
def test_config_errors_name_the_key_and_the_fix(data: dict[str, Any], key: str, fix: str) -> None:
    with pytest.raises(ConfigError) as error:
        data_cfg(**data)
    assert key in error.value.keys, str(error.value)
    assert "Fix:" in str(error.value) and fix in str(error.value)


def test_every_shard_and_source_is_in_the_data_identity(tmp_path: Path) -> None:
    files = shards(tmp_path)
    code = write_tokens(tmp_path / "code.bin", 300)
    cfg = data_cfg(
        sources=[
            {"name": "web", "path": str(tmp_path / "shards" / "*.bin"), "weight": 0.7},
            {"name": "code", "path": str(code), "weight": 0.3},
        ]
    )
    ident = data_identity(cfg)
    assert sorted(ident) == [
        "data.sources.code",
        *[f"data.sources.web/{f.name}" for f in files],
    ]
    listed = data_identity(data_cfg(path=[str(f) for f in files]))
    assert sorted(listed) == [f"data.path/{f.name}" for f in files]


def mixture_data(tmp_path: Path) -> dict[str, Any]:
    shards(tmp_path, (6, 4))
    code = write_tokens(tmp_path / "code.bin", 7 * (SEQ + 1) + 1, seed=9)
    books = write_tokens(tmp_path / "books.bin", 3 * (SEQ + 1) + 1, seed=8)
    sources = [
        {"name": "web", "path": str(tmp_path / "shards" / "*.bin"), "weight": 0.5},
        {"name": "code", "path": str(code), "weight": 0.3},
        {"name": "books", "path": str(books), "weight": 0.2},
    ]
    return {"name": "tokens", "sources": sources}


def test_a_mixture_resumes_exactly_and_reports_its_sources(ctx: Any, tmp_path: Path) -> None:
    model = {**USER_MODEL, "dropout": 0.1}
    cfg = config(model, mixture_data(tmp_path))
    assert isinstance(build_datasets(cfg.data, SEQ, 0).train, MixtureDataset)
    assert_exact_resume(cfg, ctx, tmp_path)
    straight, resumed = metrics(tmp_path / "straight"), metrics(tmp_path / "resumed")
    for name in ("web", "code", "books"):
        assert [m[f"tokens/{name}"] for m in resumed] == [m[f"tokens/{name}"] for m in straight]
    assert all(
        sum(m[f"tokens/{n}"] for n in ("web", "code", "books")) == m["tokens"] for m in straight
    )


def _as_before_orders(checkpoint: Path) -> None:
    """Make a checkpoint look written before data.order was recorded (meta.json without it, its
    digest in the completion record updated to match)."""
    meta_path = checkpoint / "meta.json"
    meta = json.loads(meta_path.read_text())
    del meta["fingerprint"]["data.order"]
    meta_path.write_text(json.dumps(meta, indent=2) + "\n")
    marker_path = checkpoint / "complete.json"
    marker = json.loads(marker_path.read_text())
    marker["files"]["meta.json"] = meta_path.stat().st_size
    marker["sha256"]["meta.json"] = hashlib.sha256(meta_path.read_bytes()).hexdigest()
    marker_path.write_text(json.dumps(marker, indent=2) + "\n")


def test_a_checkpoint_from_before_orders_resumes_with_randperm_only(
    ctx: Any, tmp_path: Path
) -> None:
    path = write_tokens(tmp_path / "train.bin", 40 * (SEQ + 1) + 1)
    data = {"name": "tokens", "path": str(path), "order": "randperm"}
    legacy = config(USER_MODEL, data)
    straight_dir, old_dir = tmp_path / "straight", tmp_path / "old"
    straight_dir.mkdir()
    old_dir.mkdir()
    assert launch(legacy, ctx, straight_dir) == STEPS
    assert launch(legacy, ctx, old_dir, stop_after=STEPS // 2) == STEPS // 2
    [saved] = find_checkpoints(old_dir)
    _as_before_orders(saved.path)

    default = config(USER_MODEL, {"name": "tokens", "path": str(path)})
    with pytest.raises(ConfigError) as refused:
        check_resume(default, old_dir)
    said = str(refused.value)
    assert refused.value.keys == ["data.order"] and "randperm order" in said
    assert "Fix: resume with data.order=randperm" in said

    check_resume(legacy, old_dir)
    assert launch(legacy, ctx, old_dir) == STEPS
    for key in ("loss", "tokens", "grad_norm"):  # bitwise the earlier order's run
        assert [m[key] for m in metrics(old_dir)] == [m[key] for m in metrics(straight_dir)]
    # and not the order a fresh run draws now
    fresh_dir = tmp_path / "fresh"
    fresh_dir.mkdir()
    launch(default, ctx, fresh_dir)
    assert [m["loss"] for m in metrics(fresh_dir)] != [m["loss"] for m in metrics(straight_dir)]
