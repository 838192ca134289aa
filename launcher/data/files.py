"""Datasets read from a local file: `text` (bytes of any UTF-8 file) and `jsonl`
(prompt/completion)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from launcher.data.sequence import IGNORE_INDEX, PAD_ID, Sample, encode_pair
from launcher.errors import DataError


def read_utf8(path: Path) -> str:
    if not path.exists():
        raise DataError(
            f"data.path: no such file: {path}. Fix: point data.path at an existing file."
        )
    if not path.is_file():
        raise DataError(f"data.path: {path} is not a file. Fix: point data.path at a file.")
    raw = path.read_bytes()
    if not raw.strip():
        raise DataError(f"data.path: {path} is empty. Fix: use a file with some text in it.")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(
            f"data.path: {path} is not UTF-8 text (bad byte at offset {exc.start}). "
            "Fix: convert it to UTF-8, or use another file."
        ) from None


class TextDataset:
    """Consecutive windows of seq_len + 1 bytes; the last window is padded."""

    def __init__(self, path: Path, seq_len: int) -> None:
        self.data = torch.tensor(list(read_utf8(path).encode("utf-8")), dtype=torch.long)
        self.seq_len = seq_len
        if len(self.data) < 2:
            raise DataError(f"data.path: {path} has fewer than 2 bytes. Fix: use a longer file.")

    def __len__(self) -> int:
        return max(1, (len(self.data) - 2) // self.seq_len + 1)

    def __getitem__(self, index: int) -> Sample:
        start = (index % len(self)) * self.seq_len
        chunk = self.data[start : start + self.seq_len + 1]
        n = len(chunk) - 1
        inputs = torch.full((self.seq_len,), PAD_ID, dtype=torch.long)
        targets = torch.full((self.seq_len,), IGNORE_INDEX, dtype=torch.long)
        inputs[:n], targets[:n] = chunk[:-1], chunk[1:]
        return Sample(inputs, targets)

    def eval_problems(self) -> list[tuple[bytes, bytes]]:
        return []


class JsonlDataset:
    """{"prompt": str, "completion": str} per line; every 10th record is held out for evaluation."""

    def __init__(self, path: Path, seq_len: int, eval_problems: int) -> None:
        self.seq_len = seq_len
        pairs: list[tuple[bytes, bytes]] = []
        for number, line in enumerate(read_utf8(path).splitlines(), start=1):
            if not line.strip():
                continue
            where = f"data.path: {path} line {number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(
                    f"{where} is not valid JSON ({exc.msg}). Fix: one JSON object per line."
                ) from None
            if (
                not isinstance(record, dict)
                or not isinstance(record.get("prompt"), str)
                or not isinstance(record.get("completion"), str)
            ):
                raise DataError(
                    f'{where} needs string fields "prompt" and "completion". '
                    'Fix: write lines like {"prompt": "2+2=", "completion": "4"}.'
                )
            prompt, completion = record["prompt"].encode(), record["completion"].encode()
            if not completion:
                raise DataError(
                    f"{where} has an empty completion: nothing to learn. Fix: drop the line."
                )
            if len(prompt) >= seq_len:
                raise DataError(
                    f"{where}: the prompt is {len(prompt)} bytes, model.seq_len is {seq_len}. "
                    "Fix: raise model.seq_len or shorten the prompt."
                )
            pairs.append((prompt, completion))
        if not pairs:
            raise DataError(
                f"data.path: {path} holds no records. Fix: add prompt/completion lines."
            )
        held = [p for i, p in enumerate(pairs) if len(pairs) >= 10 and i % 10 == 9]
        self.train = [p for i, p in enumerate(pairs) if not (len(pairs) >= 10 and i % 10 == 9)]
        self.held_out = held[:eval_problems]

    def __len__(self) -> int:
        return len(self.train)

    def __getitem__(self, index: int) -> Sample:
        return encode_pair(*self.train[index % len(self.train)], self.seq_len)

    def eval_problems(self) -> list[tuple[bytes, bytes]]:
        return [(p, c[: self.seq_len - len(p) + 1]) for p, c in self.held_out]
