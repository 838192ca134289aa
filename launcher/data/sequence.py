"""Byte-level sequences: inputs, shifted targets, -100 where nothing is to be predicted."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

IGNORE_INDEX = -100
"""Target value that the loss skips (prompt tokens and padding)."""
PAD_ID = 0


@dataclass(frozen=True)
class Sample:
    input_ids: torch.Tensor  # (seq_len,) int64
    targets: torch.Tensor  # (seq_len,) int64, IGNORE_INDEX where masked


def encode_pair(prompt: bytes, completion: bytes, seq_len: int) -> Sample:
    """Next-token sample over prompt+completion; only completion tokens are targets.

    Too long a pair is cut at seq_len + 1 tokens; the rest is padding with target -100.
    """
    full = list(prompt + completion)[: seq_len + 1]
    inputs = full[:-1] + [PAD_ID] * (seq_len - (len(full) - 1))
    targets = [tok if i + 1 >= len(prompt) else IGNORE_INDEX for i, tok in enumerate(full[1:])] + [
        IGNORE_INDEX
    ] * (seq_len - (len(full) - 1))
    return Sample(torch.tensor(inputs, dtype=torch.long), torch.tensor(targets, dtype=torch.long))


def collate(samples: list[Sample]) -> tuple[torch.Tensor, torch.Tensor]:
    return (
        torch.stack([s.input_ids for s in samples]),
        torch.stack([s.targets for s in samples]),
    )


class TokenDataset(Protocol):
    """What the training loop needs of a dataset."""

    def __len__(self) -> int:
        """Number of distinct training samples (0: unbounded, generated from the index)."""
        ...

    def __getitem__(self, index: int) -> Sample: ...

    def eval_problems(self) -> list[tuple[bytes, bytes]]:
        """Held-out (prompt, expected completion) pairs for exact-match accuracy; may be empty."""
        ...
