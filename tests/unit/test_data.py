"""Built-in and file datasets: uneven valid-token counts, held-out evaluation, clear file errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.config.data import DataConfig, DataKind
from launcher.data import IGNORE_INDEX, build_dataset
from launcher.data.reverse import is_held_out
from launcher.errors import DataError

SEQ = 24


def test_reverse_task_has_uneven_valid_tokens_and_masked_prompts() -> None:
    ds = build_dataset(DataConfig(), SEQ, seed=0)
    counts = {int((ds[i].targets != IGNORE_INDEX).sum()) for i in range(200)}
    assert len(counts) > 3  # uneven: completion length varies
    sample = ds[0]
    text = bytes(t for t in sample.input_ids.tolist() if t).decode()
    prompt, answer = text.split("|")
    valid = [t for t in sample.targets.tolist() if t != IGNORE_INDEX]
    assert bytes(valid).decode() == prompt[::-1] + "."  # only the completion is a target
    assert answer == prompt[::-1]  # the input carries the answer minus its last token


def test_reverse_is_deterministic_and_eval_is_held_out() -> None:
    a, b = build_dataset(DataConfig(), SEQ, 0), build_dataset(DataConfig(), SEQ, 0)
    assert all(bool((a[i].input_ids == b[i].input_ids).all()) for i in range(20))
    problems = a.eval_problems()
    assert len(problems) == DataConfig().held_out_problems == 256
    assert all(is_held_out(p.decode()[:-1]) for p, _ in problems)
    train_texts = {
        bytes(t for t in a[i].input_ids.tolist() if t).decode().split("|")[0] for i in range(2000)
    }
    assert not any(is_held_out(t) for t in train_texts)


def test_text_dataset(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("hello world, " * 10)
    ds = build_dataset(DataConfig(name=DataKind.text, path=str(path)), 16, 0)
    assert len(ds) >= 7
    assert bytes(ds[0].input_ids.tolist()) == b"hello world, hel"
    assert (ds[len(ds) - 1].targets == IGNORE_INDEX).any()  # the last window is padded


def test_jsonl_masks_prompt(tmp_path: Path) -> None:
    path = tmp_path / "pairs.jsonl"
    path.write_text("\n".join(f'{{"prompt": "q{i}=", "completion": "a{i}"}}' for i in range(20)))
    ds = build_dataset(DataConfig(name=DataKind.jsonl, path=str(path)), 16, 0)
    assert len(ds) == 18 and len(ds.eval_problems()) == 2
    valid = [t for t in ds[0].targets.tolist() if t != IGNORE_INDEX]
    assert bytes(valid) == b"a0"


@pytest.mark.parametrize(
    ("kind", "content", "message"),
    [
        (DataKind.text, None, "no such file"),
        (DataKind.text, b"", "is empty"),
        (DataKind.text, b"\xff\xfe\xfa", "not UTF-8"),
        (
            DataKind.jsonl,
            b'{"prompt": "a", "completion": "b"}\nnot json\n',
            "line 2 is not valid JSON",
        ),
        (DataKind.jsonl, b'{"prompt": "a"}\n', 'needs string fields "prompt" and "completion"'),
        (DataKind.jsonl, b'{"prompt": "' + b"x" * 40 + b'", "completion": "b"}\n', "model.seq_len"),
    ],
)
def test_bad_files_are_clear_errors(
    tmp_path: Path, kind: DataKind, content: bytes | None, message: str
) -> None:
    path = tmp_path / "data"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(DataError) as info:
        build_dataset(DataConfig(name=kind, path=str(path)), 16, 0)
    assert message in str(info.value)
    assert "data.path" in str(info.value) and "Fix:" in str(info.value)
