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


CHAT_SPECIAL = ("<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""ChatML, rendered turn by turn (assistant spans found by prefix differences)."""
CHAT_TEMPLATE_MARKED = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['role'] == 'assistant' %}"
    "{% generation %}{{ m['content'] }}<|im_end|>\n{% endgeneration %}{% else %}"
    "{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""The same text, the assistant's part marked with {% generation %}."""


def train_tokenizer(directory: Path, vocab_size: int = 120, chat: bool = False) -> Path:
    """A small BPE tokenizer trained on a few KB of text, saved as a directory (chat: with
    ChatML's special tokens)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    special = ["<unk>", "</s>", *(CHAT_SPECIAL if chat else ())]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special)
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


def write_conversations(path: Path, n: int, seed: int = 0) -> Path:
    """{"messages": [...]} JSON Lines: a system turn on some, then 1-3 user/assistant rounds (the
    assistant repeats the user's words in reverse), so records differ in length."""
    rng = np.random.default_rng(seed)
    texts = iter(sentences(4 * n, seed))
    lines = []
    for i in range(n):
        messages = [{"role": "system", "content": "reverse"}] if i % 3 == 0 else []
        for _ in range(int(rng.integers(1, 4))):
            said = next(texts)
            messages.append({"role": "user", "content": said})
            messages.append({"role": "assistant", "content": " ".join(said.split()[::-1])})
        lines.append(json.dumps({"messages": messages}))
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
