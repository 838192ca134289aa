"""data=hf: a tokenizer trained here, local json/jsonl data; packing, masking, the cache (issue
13)."""

from __future__ import annotations

import json
import multiprocessing
import shutil
import sys
from pathlib import Path

import pytest

from launcher.config.data import DataConfig, DataKind
from launcher.data import IGNORE_INDEX
from launcher.data.build import build_datasets
from launcher.data.hf import prepare
from launcher.data.sampler import GlobalBatchSampler
from launcher.data.tokenizer import load_tokenizer
from launcher.errors import DataError
from tests.data_sources import train_tokenizer, write_pairs, write_texts
from tests.installed import require

require("datasets", "tokenizers")

SEQ = 32


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf")
    return {
        "tok": train_tokenizer(root / "tok"),
        "pairs": write_pairs(root / "pairs.jsonl", 40),
        "texts": write_texts(root / "texts.jsonl", 40),
    }


def hf_cfg(files: dict[str, Path], tmp_path: Path, kind: str = "texts", **kw: object) -> DataConfig:
    tuning = {"prompt_field": "prompt", "completion_field": "completion"} if kind == "pairs" else {}
    base = {"path": str(files[kind]), "tokenizer": str(files["tok"])}
    base["cache_dir"] = str(tmp_path / "cache")
    return DataConfig(name=DataKind.hf, **{**base, **tuning, **kw})  # type: ignore[arg-type]


def test_pretraining_packs_documents_with_eos(files: dict[str, Path], tmp_path: Path) -> None:
    tok = load_tokenizer(str(files["tok"]), None)
    docs = [json.loads(line)["text"] for line in files["texts"].read_text().splitlines()]
    expected = [t for ids in tok.encode(docs) for t in [*ids, tok.eos_id]]
    ds = build_datasets(hf_cfg(files, tmp_path), SEQ, 0, 256).train
    assert len(ds) == -(-(len(expected) - 1) // SEQ)
    got = [t for i in range(len(ds)) for t in ds[i].targets.tolist() if t != IGNORE_INDEX]
    assert got == expected[1:]  # every token after the first is a target once, EOS included


def test_fine_tuning_masks_the_prompt(files: dict[str, Path], tmp_path: Path) -> None:
    tok = load_tokenizer(str(files["tok"]), None)
    first = json.loads(files["pairs"].read_text().splitlines()[0])
    (prompt,), (completion,) = tok.encode([first["prompt"]]), tok.encode([first["completion"]])
    padded = build_datasets(hf_cfg(files, tmp_path, "pairs"), SEQ, 0, 256).train
    assert len(padded) == 40
    sample = padded[0]
    valid = [t for t in sample.targets.tolist() if t != IGNORE_INDEX]
    assert valid == [*completion, tok.eos_id]
    assert sample.input_ids[: len(prompt)].tolist() == prompt
    assert (sample.targets[: len(prompt) - 1] == IGNORE_INDEX).all()
    packed = build_datasets(hf_cfg(files, tmp_path, "pairs", packing=True), SEQ, 0, 256).train
    assert len(packed) < len(padded)
    count = sum(int(packed[i].targets.ne(IGNORE_INDEX).sum()) for i in range(len(packed)))
    total = sum(int(padded[i].targets.ne(IGNORE_INDEX).sum()) for i in range(len(padded)))
    assert count == total  # the same completion tokens, packed into fewer sequences


def test_val_path_holdout_and_epoch_coverage(files: dict[str, Path], tmp_path: Path) -> None:
    cfg = hf_cfg(files, tmp_path, "pairs", val_path=str(files["pairs"]), holdout=0)
    data = build_datasets(cfg, SEQ, 0, 256)
    assert data.val is not None and len(data.val) == len(data.train) == 40
    held = build_datasets(hf_cfg(files, tmp_path, "pairs", holdout=8), SEQ, 0, 256)
    assert len(held.train) == 32 and held.val is not None and len(held.val) == 8
    sampler = GlobalBatchSampler(32, 8, seed=1)
    assert sorted(i for s in range(4) for i in sampler.global_batch(s)) == list(range(32))


def test_cache_is_built_once_and_keyed(files: dict[str, Path], tmp_path: Path) -> None:
    cfg = hf_cfg(files, tmp_path)
    first, built = prepare("data.path", str(files["texts"]), cfg)
    assert built
    again, built = prepare("data.path", str(files["texts"]), cfg)
    assert again == first and not built
    other, built = prepare(
        "data.path", str(files["texts"]), hf_cfg(files, tmp_path, eos_token="<unk>")
    )
    assert other != first and built
    copy = tmp_path / "texts.jsonl"
    copy.write_text(files["texts"].read_text())
    moved, built = prepare("data.path", str(copy), cfg)
    assert moved != first and built


def _prepare_in_child(cfg: DataConfig, path: str, out: multiprocessing.Queue) -> None:
    out.put(prepare("data.path", path, cfg)[1])


def test_one_process_tokenizes_while_the_others_wait(
    files: dict[str, Path], tmp_path: Path
) -> None:
    if sys.platform != "linux":
        pytest.skip("fork")
    ctx = multiprocessing.get_context("fork")
    out: multiprocessing.Queue = ctx.Queue()
    cfg = hf_cfg(files, tmp_path)
    procs = [
        ctx.Process(target=_prepare_in_child, args=(cfg, str(files["texts"]), out))
        for _ in range(3)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert sorted(out.get(timeout=5) for _ in procs) == [False, False, True]
    assert not [p for p in (tmp_path / "cache").iterdir() if ".tmp-" in p.name]


def test_bad_input_names_key_file_and_fix(files: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(DataError) as info:
        build_datasets(hf_cfg(files, tmp_path, text_field="body"), SEQ, 0, 256)
    text = str(info.value)
    assert "data.text_field" in text and "'body'" in text and str(files["texts"]) in text
    assert "its fields: text" in text and "Fix:" in text
    with pytest.raises(DataError, match=r"data.completion_field: no field 'answer'"):
        build_datasets(hf_cfg(files, tmp_path, "pairs", completion_field="answer"), SEQ, 0, 256)
    for bad in (tmp_path / "nowhere", files["texts"], tmp_path):
        cfg = hf_cfg(files, tmp_path)
        cfg.tokenizer = str(bad)
        with pytest.raises(DataError, match=r"data.tokenizer: .* is not a tokenizer directory"):
            build_datasets(cfg, SEQ, 0, 256)
    with pytest.raises(DataError, match=r"past the model.s vocabulary of 40.*model.vocab_size"):
        build_datasets(hf_cfg(files, tmp_path), SEQ, 0, 40)
    with pytest.raises(DataError, match=r"data.path: no such file"):
        build_datasets(hf_cfg(files, tmp_path, path=str(tmp_path / "gone.jsonl")), SEQ, 0)
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"text": "a b"}\n{not json\n')
    with pytest.raises(DataError, match=r"data.path: cannot read"):
        build_datasets(hf_cfg(files, tmp_path, path=str(broken)), SEQ, 0)


def test_missing_extra_names_the_install_command(
    files: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(DataError, match=r"pip install 'launcher\[hf\]'"):
        build_datasets(hf_cfg(files, tmp_path, "pairs"), SEQ, 0)


def test_the_tokenized_cache_follows_launcher_cache_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # $LAUNCHER_CACHE_DIR moves token_scans.json; the tokenized data went to ~/.cache regardless
    from launcher.data.hf import cache_root

    monkeypatch.delenv("LAUNCHER_CACHE", raising=False)
    monkeypatch.setenv("LAUNCHER_CACHE_DIR", str(tmp_path))
    assert (
        cache_root(DataConfig(name=DataKind.hf, path="c.jsonl", tokenizer="t")) == tmp_path / "data"
    )
    monkeypatch.setenv("LAUNCHER_CACHE", str(tmp_path / "own"))  # the older variable still wins
    assert (
        cache_root(DataConfig(name=DataKind.hf, path="c.jsonl", tokenizer="t")) == tmp_path / "own"
    )


def test_a_link_or_a_stranger_where_the_cache_goes_is_refused(
    files: dict[str, Path], tmp_path: Path
) -> None:
    # a link there: tokenized, the rename failed, then a traceback reading meta.json through it
    from launcher.errors import ConfigError

    cfg = hf_cfg(files, tmp_path, tokenize_workers=1)
    final, _ = prepare("data.path", str(files["texts"]), cfg)
    shutil.rmtree(final)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "keep").write_text("keep")
    final.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ConfigError, match="symbolic link") as info:
        prepare("data.path", str(files["texts"]), cfg)
    assert info.value.keys == ["data.cache_dir"] and f"rm {final}" in str(info.value)
    final.unlink()
    final.mkdir()  # a directory without meta.json
    with pytest.raises(ConfigError, match=r"no meta\.json") as info:
        prepare("data.path", str(files["texts"]), cfg)
    assert f"mv {final} {final}.old" in str(info.value)
    assert [p.name for p in (tmp_path / "elsewhere").iterdir()] == ["keep"]


def test_a_source_field_that_is_not_there_names_the_source(
    files: dict[str, Path], tmp_path: Path
) -> None:
    from launcher.config.data import SourceConfig

    sources = [
        SourceConfig("a", 1, str(files["texts"])),
        SourceConfig("b", 1, str(files["texts"]), text_field="nope"),
    ]
    cfg = hf_cfg(files, tmp_path, path=None, sources=sources, tokenize_workers=1)
    with pytest.raises(DataError, match=r"^data\.sources\[1\]\.text_field: no field 'nope'"):
        build_datasets(cfg, SEQ, 0, 256)
