"""data=hf conversations (issue 32): rendered with the chat template, only the assistant's turns as
targets (found by prefix differences or by {% generation %} marks, the same tokens either way),
train_on=all, the cache keyed by the template, a cut counted once, and one error naming the record
or the key for every bad input."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from launcher.config.data import DataConfig, DataKind, TrainOn
from launcher.config.load import to_root_config
from launcher.data import IGNORE_INDEX
from launcher.data.build import build_datasets
from launcher.data.hf import prepare
from launcher.data.tokenizer import load_tokenizer
from launcher.errors import ConfigError, DataError
from tests.data_sources import (
    CHAT_TEMPLATE,
    CHAT_TEMPLATE_MARKED,
    train_tokenizer,
    write_conversations,
)
from tests.installed import require

require("datasets", "transformers")

SEQ = 128


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("chat")
    return {
        "tok": train_tokenizer(root / "tok", chat=True),
        "chat": write_conversations(root / "chat.jsonl", 12),
    }


def cfg(files: dict[str, Path], tmp_path: Path, **kw: Any) -> DataConfig:
    base: dict[str, Any] = {
        "path": str(files["chat"]),
        "tokenizer": str(files["tok"]),
        "messages_field": "messages",
        "chat_template": CHAT_TEMPLATE,
        "cache_dir": str(tmp_path / "cache"),
    }
    return DataConfig(name=DataKind.hf, **{**base, **kw})


def records(files: dict[str, Path]) -> list[list[dict[str, str]]]:
    return [json.loads(line)["messages"] for line in files["chat"].read_text().splitlines()]


def test_only_the_assistant_turns_and_their_end_are_targets(
    files: dict[str, Path], tmp_path: Path
) -> None:
    tok = load_tokenizer(str(files["tok"]), None)
    data = build_datasets(cfg(files, tmp_path), SEQ, 0, 256).train
    for index, messages in enumerate(records(files)):
        answers = [m["content"] + "<|im_end|>" for m in messages if m["role"] == "assistant"]
        expected = [t for ids in tok.encode(answers) for t in ids]
        got = [t for t in data[index].targets.tolist() if t != IGNORE_INDEX]
        assert got == expected, index
    # The same tokens when the template marks the assistant's part with {% generation %}.
    marked = build_datasets(cfg(files, tmp_path, chat_template=CHAT_TEMPLATE_MARKED), SEQ, 0, 256)
    for index in range(len(data)):
        assert marked.train[index].targets.equal(data[index].targets)
        assert marked.train[index].input_ids.equal(data[index].input_ids)


def test_train_on_all_and_the_template_is_in_the_cache_key(
    files: dict[str, Path], tmp_path: Path
) -> None:
    every = build_datasets(cfg(files, tmp_path, train_on=TrainOn.all), SEQ, 0, 256).train
    sample = every[0]
    real = int((sample.input_ids != 1).sum())  # padding is EOS (</s>), not in ChatML's text
    valid = sample.targets != IGNORE_INDEX
    assert int(valid.sum()) == real > 0 and valid[:real].all()  # every token after the first
    first, _ = prepare("data.path", str(files["chat"]), cfg(files, tmp_path))
    again, built = prepare("data.path", str(files["chat"]), cfg(files, tmp_path))
    assert again == first and not built
    (tmp_path / "t.jinja").write_text(CHAT_TEMPLATE_MARKED)
    other, built = prepare(
        "data.path",
        str(files["chat"]),
        cfg(files, tmp_path, chat_template=str(tmp_path / "t.jinja")),
    )
    assert other != first and built
    every_dir = prepare("data.path", str(files["chat"]), cfg(files, tmp_path, train_on=TrainOn.all))
    assert every_dir[0] not in (first, other)


def test_a_cut_is_counted_once(
    files: dict[str, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    lengths = [
        len(load_tokenizer(str(files["tok"]), None).encode([json.dumps(r)])[0])
        for r in records(files)
    ]
    assert lengths  # the conversations differ in length; some pass 24 tokens
    with caplog.at_level(logging.WARNING, logger="launcher"):
        build_datasets(cfg(files, tmp_path), 24, 0, 256)
        build_datasets(cfg(files, tmp_path), 24, 0, 256)
    cuts = [r.getMessage() for r in caplog.records if "are cut" in r.getMessage()]
    assert len(cuts) == 1 and " of 12 records" in cuts[0] and "model.seq_len" in cuts[0]


def test_a_failing_template_names_the_record(files: dict[str, Path], tmp_path: Path) -> None:
    longest = max(range(12), key=lambda i: len(records(files)[i]))
    size = len(records(files)[longest])
    failing = (
        f"{{% if messages|length == {size} %}}{{{{ raise_exception('no room') }}}}{{% endif %}}"
        + CHAT_TEMPLATE
    )
    with pytest.raises(DataError) as err:
        build_datasets(cfg(files, tmp_path, chat_template=failing), SEQ, 0, 256)
    first = min(i for i in range(12) if len(records(files)[i]) == size)
    assert f"record {first} of" in str(err.value) and "no room" in str(err.value)
    assert "data.chat_template" in str(err.value)
    rewriting = "{{ messages|length }}" + CHAT_TEMPLATE  # earlier text changes with each turn
    with pytest.raises(DataError, match=r"record 0 of .*turn by turn.*data.train_on=all"):
        build_datasets(cfg(files, tmp_path, chat_template=rewriting), SEQ, 0, 256)
    with pytest.raises(DataError, match=r"data.chat_template: the tokenizer .* no chat template"):
        build_datasets(cfg(files, tmp_path, chat_template=None), SEQ, 0, 256)
    with pytest.raises(DataError, match=r"neither a template .* nor a file"):
        build_datasets(cfg(files, tmp_path, chat_template="missing.jinja"), SEQ, 0, 256)


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"name": "tokens", "path": "x.bin", "messages_field": "messages"}, "data.messages_field"),
        ({"name": "tokens", "path": "x.bin", "packing": True}, "data.packing"),
        ({"name": "hf", "path": "x", "tokenizer": "t", "packing": "bogus"}, "data.packing"),
        ({"name": "hf", "path": "x", "tokenizer": "t", "train_on": "all"}, "data.train_on"),
        ({"name": "hf", "path": "x", "tokenizer": "t", "train_on": "user"}, "data.train_on"),
        (
            {"name": "hf", "path": "x", "tokenizer": "t", "chat_template": "t.jinja"},
            "data.chat_template",
        ),
        (
            {
                "name": "hf",
                "path": "x",
                "tokenizer": "t",
                "messages_field": "m",
                "prompt_field": "p",
                "completion_field": "c",
            },
            "data.messages_field",
        ),
        (
            {
                "name": "hf",
                "path": "x",
                "tokenizer": "t",
                "messages_field": "m",
                "cross_document_attention": True,
            },
            "data.cross_document_attention",
        ),
    ],
)
def test_bad_settings_name_the_key(data: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        to_root_config({"data": data})
    assert key in str(err.value)


def test_packing_values_from_the_command_line() -> None:
    base = {"name": "hf", "path": "x", "tokenizer": "t"}
    for given, expected in [("true", True), (True, True), ("false", False), ("concat", "concat")]:
        assert to_root_config({"data": {**base, "packing": given}}).data.packing == expected
    tuned = to_root_config({"data": {**base, "messages_field": "m", "packing": "concat"}}).data
    plain = to_root_config({"data": {**base, "messages_field": "m"}}).data
    assert tuned.document_masks and not plain.document_masks


def test_the_fingerprint_holds_the_layout_and_the_conversation_keys() -> None:
    from launcher.checkpoint.compat import fingerprint
    from launcher.data.packing import PLACEMENT

    base = {"name": "hf", "path": "x", "tokenizer": "t", "messages_field": "m"}
    packed = fingerprint(to_root_config({"data": {**base, "packing": True}}))
    assert packed["data.packing_layout"] == PLACEMENT and packed["data.train_on"] == "assistant"
    every = fingerprint(to_root_config({"data": {**base, "packing": True, "train_on": "all"}}))
    assert every["data.train_on"] == "all"
    assert "data.packing_layout" not in fingerprint(to_root_config({"data": base}))


@pytest.mark.parametrize(
    ("before", "resumes_with"),
    [
        ({}, {"cross_document_attention": True}),  # pretraining: attention ran across documents
        ({"packing": True}, {"packing": "concat", "cross_document_attention": True}),
    ],
)
def test_a_checkpoint_from_before_document_masks_resumes_only_on_its_own_windows(
    tmp_path: Path, before: dict[str, Any], resumes_with: dict[str, Any]
) -> None:
    """Before document masks, data=hf pretraining attended across documents and packing=true
    meant concatenate-and-cut: such a checkpoint (no data.cross_document_attention in its
    fingerprint) is refused on today's defaults, with the settings that train its windows."""
    from launcher.checkpoint.compat import check_compatible, fingerprint

    base = {"name": "hf", "path": "x", "tokenizer": "t"}
    old = fingerprint(to_root_config({"data": {**base, **before}}))
    old.pop("data.cross_document_attention")
    old.pop("data.packing_layout", None)
    if before.get("packing") is True:
        old["data.packing"] = True  # what a checkpoint of then says
    meta = {"fingerprint": old}
    with pytest.raises(ConfigError) as refused:
        check_compatible(meta, to_root_config({"data": {**base, **before}}), tmp_path)
    fix = str(refused.value).split("Fix: resume with ")[1].split(",")[0]
    given = dict(item.split("=", 1) for item in fix.split())
    assert given == {f"data.{k}": str(v) for k, v in resumes_with.items()}
    check_compatible(meta, to_root_config({"data": {**base, **resumes_with}}), tmp_path)


def test_a_damaged_or_linked_packed_layout_is_computed_again(tmp_path: Path) -> None:
    # was: a traceback from np.load on every launch until the file was found and removed
    import numpy as np

    from launcher.data.packing import packed_layout

    offsets = np.array([0, 5, 9, 30, 33, 40], dtype=np.int64)
    order, starts = packed_layout(tmp_path, offsets, 16)
    (tmp_path / "packed-16.npz").write_bytes(b"garbage")
    again = packed_layout(tmp_path, offsets, 16)
    assert np.array_equal(again[0], order) and np.array_equal(again[1], starts)
    victim = tmp_path / "victim.npz"
    np.savez(victim, order=np.array([9]), starts=np.array([0, 1]))
    (tmp_path / "packed-16.npz").unlink()
    (tmp_path / "packed-16.npz").symlink_to(victim)
    again = packed_layout(tmp_path, offsets, 16)
    assert np.array_equal(again[0], order) and not (tmp_path / "packed-16.npz").is_symlink()
    assert np.load(victim)["order"].tolist() == [9]  # replaced the link, not written through
