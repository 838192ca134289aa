"""Data identity and checkpoint checksums (issue 22), in one process: a resume after a token
file was truncated, a JSONL file replaced or a tokenizer retrained is refused naming the file; a
byte-for-byte copy resumes; a checkpoint file overwritten in place (same size) is skipped as
damaged, naming the file; an unchanged file's digest comes from the cache without a read."""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

import pytest

from launcher.checkpoint.checkpointer import Checkpointer
from launcher.checkpoint.files import find_checkpoints
from launcher.checkpoint.preflight import check_resume
from launcher.config.root import RootConfig
from launcher.distributed import DistContext
from launcher.errors import ConfigError
from launcher.integrity import digests
from launcher.integrity.digests import cached_digests
from tests.data_sources import train_tokenizer, write_texts, write_tokens
from tests.harness import build_trainer
from tests.unit.test_checkpoint import config, ctx, train, warnings_seen

__all__ = ["ctx", "warnings_seen"]  # fixtures


def _trained(cfg: RootConfig, ctx: DistContext, run_dir: Path) -> None:
    """Two steps, a checkpoint after each (the data identity is recorded in both)."""
    trainer = build_trainer(cfg, ctx, run_dir)
    checkpoints = Checkpointer(cfg, run_dir, ctx, trainer)
    train(trainer, checkpoints, 2)
    checkpoints.save_final()


def test_changed_data_refuses_the_resume_and_a_copy_resumes(
    ctx: DistContext, tmp_path: Path, warnings_seen: list[str]
) -> None:
    texts = write_texts(tmp_path / "texts.jsonl", 40)
    tok = train_tokenizer(tmp_path / "tok")
    hf = {"name": "hf", "path": str(texts), "tokenizer": str(tok), "cache_dir": str(tmp_path)}
    model = {"seq_len": 16}
    cfg = config(data=hf, model=model, train={"steps": 2}, checkpoint={"every": 1})
    _trained(cfg, ctx, tmp_path / "run")

    run = tmp_path / "run"
    shutil.copyfile(texts, tmp_path / "saved.jsonl")
    shutil.copytree(tok, tmp_path / "saved_tok")
    texts.unlink()  # a byte-for-byte copy in its place: another inode and mtime, same bytes
    shutil.copyfile(tmp_path / "saved.jsonl", texts)
    check_resume(cfg, run)  # the content decides: resumes

    write_texts(texts, 3)  # the JSONL replaced
    with pytest.raises(ConfigError) as refused:
        check_resume(cfg, run)
    assert f"data.path ({texts})" in str(refused.value)
    assert "checkpoint.allow_data_change=true" in str(refused.value)
    shutil.copyfile(tmp_path / "saved.jsonl", texts)

    train_tokenizer(tok, vocab_size=40)  # retrained, saved in the same directory
    with pytest.raises(ConfigError) as refused:
        check_resume(cfg, run)
    assert f"data.tokenizer/tokenizer.json ({tok / 'tokenizer.json'})" in str(refused.value)

    allowed = dataclasses.replace(
        cfg, checkpoint=dataclasses.replace(cfg.checkpoint, allow_data_change=True)
    )
    warnings_seen.clear()
    check_resume(allowed, run)  # goes on, saying what changed
    [said] = warnings_seen
    assert said.startswith("checkpoint.allow_data_change=true: the data changed since")
    assert "data.tokenizer/tokenizer.json" in said and "resuming on the new data" in said
    shutil.rmtree(tok)
    shutil.copytree(tmp_path / "saved_tok", tok)
    check_resume(cfg, run)

    # Copied elsewhere (a job's scratch directory), the data and the tokenizer resume there: the
    # content decides, not the path.
    moved = dataclasses.replace(
        cfg,
        data=dataclasses.replace(
            cfg.data, path=str(tmp_path / "saved.jsonl"), tokenizer=str(tmp_path / "saved_tok")
        ),
    )
    check_resume(moved, run)
    shutil.copyfile(texts, tmp_path / "other.jsonl")
    write_texts(tmp_path / "other.jsonl", 3)  # but other content at the new path is refused
    with pytest.raises(ConfigError, match=r"other content|bytes, was"):
        check_resume(
            dataclasses.replace(
                moved, data=dataclasses.replace(moved.data, path=str(tmp_path / "other.jsonl"))
            ),
            run,
        )


def test_a_truncated_token_file_refuses_the_resume(ctx: DistContext, tmp_path: Path) -> None:
    path = write_tokens(tmp_path / "train.bin", 40 * 17 + 1)
    cfg = config(data={"name": "tokens", "path": str(path)}, model={"seq_len": 16})
    _trained(cfg, ctx, tmp_path / "run")
    check_resume(cfg, tmp_path / "run")
    with open(path, "r+b") as f:
        f.truncate(300)
    with pytest.raises(ConfigError) as refused:
        check_resume(cfg, tmp_path / "run")
    assert f"data.path ({path}) has 300 bytes, was {40 * 17 * 2 + 2}" in str(refused.value)


def test_a_checkpoint_file_overwritten_in_place_is_skipped_naming_it(
    ctx: DistContext, tmp_path: Path, warnings_seen: list[str]
) -> None:
    cfg = config(train={"steps": 2}, checkpoint={"every": 1})
    _trained(cfg, ctx, tmp_path)
    newest = find_checkpoints(tmp_path)[0].path
    damaged = max((newest / "engine").glob("*.distcp"), key=lambda p: p.stat().st_size)
    size = damaged.stat().st_size
    with open(damaged, "r+b") as f:  # 64 bytes in the middle (an optimizer moment, say)
        f.seek(size // 2)
        f.write(os.urandom(64))
    assert damaged.stat().st_size == size
    rel = damaged.relative_to(newest)

    assert [c.step for c in find_checkpoints(tmp_path)] == [1]  # generate, serve, export
    assert any(f"{rel} does not match the digest" in w for w in warnings_seen)
    trainer = build_trainer(cfg, ctx, tmp_path)
    resumed = Checkpointer(cfg, tmp_path, ctx, trainer).resume()
    assert resumed is not None and resumed.step == 1  # the older one, intact


def test_a_damaged_meta_json_is_skipped_before_it_is_believed(
    ctx: DistContext, tmp_path: Path
) -> None:
    """meta.json is what a resume compares the config with: overwritten in place (same size, a
    different model width), the checkpoint is damaged, not a config change with a Fix that sends
    the user back and forth between two widths."""
    cfg = config(train={"steps": 2}, checkpoint={"every": 1})
    _trained(cfg, ctx, tmp_path)
    meta = find_checkpoints(tmp_path)[0].path / "meta.json"
    text = meta.read_text()
    at = text.index('"model.d_model": ') + len('"model.d_model": ')
    other = "1" if text[at] != "1" else "2"
    meta.write_text(text[:at] + other + text[at + 1 :])
    assert meta.stat().st_size == len(text.encode())
    assert [c.step for c in find_checkpoints(tmp_path, warn=False, verify=False)] == [1]
    assert check_resume(cfg, tmp_path) == cfg  # compared with step 1, intact: no error


def test_an_unchanged_file_is_not_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LAUNCHER_CACHE_DIR", str(tmp_path / "cache"))
    path = write_tokens(tmp_path / "big.bin", 4096)
    first = cached_digests([path])[path]
    stat = path.stat()
    data = bytearray(path.read_bytes())
    data[0] ^= 0xFF
    with open(path, "r+b") as f:  # same size, same inode; mtime put back: the cache answers
        f.write(data)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    digests._seen.clear()  # as in a new process: only the cache file knows the digest
    assert cached_digests([path])[path] == first
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))  # touched: read again
    assert cached_digests([path])[path] != first


def test_a_weights_file_is_known_by_its_tensors_not_its_metadata(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 34's review: re-exporting the same base wrote other safetensors metadata, and an
    adapter run's base identity (a digest of the file's bytes) refused the resume."""
    import torch
    from safetensors.torch import save_file

    from launcher.integrity.digests import file_digest, weights_digest

    monkeypatch.setenv("LAUNCHER_CACHE_DIR", str(tmp_path / "cache"))
    a, b = torch.arange(6.0).reshape(2, 3), torch.ones(4, dtype=torch.int64)
    first, second, other = tmp_path / "1.safetensors", tmp_path / "2.safetensors", tmp_path / "3"
    save_file({"a": a, "b": b}, str(first), metadata={"step": "20", "output": "x"})
    save_file({"b": b, "a": a}, str(second), metadata={"output": "y", "step": "20"})
    other.mkdir()
    save_file({"a": a + 1, "b": b}, str(other / "w.safetensors"), metadata={"step": "20"})
    assert file_digest(first) != file_digest(second)  # the bytes differ
    assert weights_digest(first) == weights_digest(second)  # the weights do not
    assert weights_digest(first) != weights_digest(other / "w.safetensors")
    assert weights_digest(first) == weights_digest(first)  # cached, the same answer


def test_shards_given_in_another_order_are_a_change(tmp_path: Path) -> None:
    # was: the same files in another order resumed, on other samples in the same steps
    from launcher.config.data import DataConfig, DataKind
    from launcher.integrity.data import changes, data_identity

    for name in ("a.bin", "b.bin"):
        (tmp_path / name).write_bytes(name.encode() * 64)
    a, b = str(tmp_path / "a.bin"), str(tmp_path / "b.bin")
    was = data_identity(DataConfig(name=DataKind.tokens, path=str(tmp_path / "*.bin")))
    assert changes(was, data_identity(DataConfig(name=DataKind.tokens, path=[a, b]))) == []
    swapped = changes(was, data_identity(DataConfig(name=DataKind.tokens, path=[b, a])))
    assert len(swapped) == 2 and "is file 2 of its list, was 1" in swapped[0]
    old = {name: {k: v for k, v in e.items() if k != "position"} for name, e in was.items()}
    assert changes(old, data_identity(DataConfig(name=DataKind.tokens, path=[b, a]))) == []
