"""Data the data-source tests build here (nothing is downloaded): token files, a tokenizer trained
on a few KB of text, prompt/completion files, and a map-style dataset for data=custom."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

WORDS = [
    "the",
    "cat",
    "sat",
    "on",
    "a",
    "mat",
    "and",
    "a",
    "dog",
    "ran",
    "to",
    "the",
    "big",
    "red",
    "barn",
    "while",
    "birds",
    "sang",
]


def sentences(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(3, 12)))) for _ in range(n)]


def write_tokens(
    path: Path, n: int, dtype: str = "uint16", vocab: int = 256, seed: int = 0
) -> Path:
    rng = np.random.default_rng(seed)
    rng.integers(0, vocab, size=n).astype(dtype).tofile(path)
    return path


def train_tokenizer(directory: Path, vocab_size: int = 120) -> Path:
    """A small BPE tokenizer trained on a few KB of text, saved as a directory."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>", "</s>"])
    tok.train_from_iterator(sentences(400), trainer)
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    return directory


def write_pairs(path: Path, n: int, seed: int = 0) -> Path:
    """prompt/completion JSON Lines: the completion repeats the prompt's words in reverse."""
    lines = []
    for text in sentences(n, seed):
        lines.append(
            json.dumps({"prompt": text + " :", "completion": " ".join(text.split()[::-1])})
        )
    path.write_text("\n".join(lines) + "\n")
    return path


def write_texts(path: Path, n: int, seed: int = 0) -> Path:
    path.write_text("\n".join(json.dumps({"text": t}) for t in sentences(n, seed)) + "\n")
    return path


class ToyDataset:
    """A map-style dataset of {"input_ids", "labels"}: counting sequences mod `vocab`."""

    def __init__(self, size: int, seq_len: int, vocab: int = 256) -> None:
        self.size, self.seq_len, self.vocab = size, seq_len, vocab

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict[str, Any]:
        if not 0 <= index < self.size:
            raise IndexError(index)
        ids = (torch.arange(self.seq_len + 1) * (index % 7 + 1) + index) % self.vocab
        labels = ids[1:].clone()
        labels[: index % 3] = -100  # uneven valid-token counts
        return {"input_ids": ids[:-1], "labels": labels}


def make_dataset(size: int = 64, seq_len: int = 16, vocab: int = 256) -> ToyDataset:
    return ToyDataset(size, seq_len, vocab)


def not_a_mapping(size: int = 4) -> list[list[int]]:
    return [[1, 2, 3]] * size
