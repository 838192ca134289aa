"""Byte-level sequences: inputs, shifted targets, -100 where nothing is to be predicted."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import torch

IGNORE_INDEX = -100
"""Target value that the loss skips (prompt tokens and padding)."""
PAD_ID = 0


@dataclass(frozen=True)
class Sample:
    input_ids: torch.Tensor  # (seq_len,) int64
    targets: torch.Tensor  # (seq_len,) int64, IGNORE_INDEX where masked
    position_ids: torch.Tensor | None = None
    """(seq_len,) int64: each document's own positions, restarting at 0 where a document starts
    (packed sequences; launcher/data/packed.py). None: one sequence, positions 0..seq_len-1."""


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


class Batch(NamedTuple):
    """A micro-batch: inputs and targets (batch, seq_len); position ids for packed documents."""

    inputs: torch.Tensor
    targets: torch.Tensor
    position_ids: torch.Tensor | None = None

    def model_kwargs(self) -> dict[str, Any]:
        """The forward's keyword arguments besides the input ids (position_ids when packed:
        the model restarts positions and attention at each document)."""
        return {} if self.position_ids is None else {"position_ids": self.position_ids}

    def _map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> Batch:
        positions = self.position_ids
        return Batch(
            fn(self.inputs), fn(self.targets), None if positions is None else fn(positions)
        )

    def to(self, device: torch.device, non_blocking: bool = False) -> Batch:
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> Batch:
        return self._map(lambda t: t.pin_memory())

    def head(self, n: int) -> Batch:
        """The first n sequences."""
        return self._map(lambda t: t[:n])


def collate(samples: list[Sample]) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets): the samples stacked, without positions (see collate_batch)."""
    return (
        torch.stack([s.input_ids for s in samples]),
        torch.stack([s.targets for s in samples]),
    )


def collate_batch(samples: list[Sample]) -> Batch:
    """The samples stacked, with their position ids when any sample carries some."""
    positions = [s.position_ids for s in samples]
    if all(p is None for p in positions):
        stacked = None
    else:  # a sequence without its own positions is one document: 0..seq_len-1
        stacked = torch.stack(
            [
                torch.arange(len(s.input_ids)) if p is None else p
                for s, p in zip(samples, positions, strict=True)
            ]
        )
    return Batch(
        torch.stack([s.input_ids for s in samples]),
        torch.stack([s.targets for s in samples]),
        stacked,
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
