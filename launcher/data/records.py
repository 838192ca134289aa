"""One record per sequence, padded: fine-tuning pairs stored as flat tokens, a target mask and the
record offsets (what launcher/data/hf.py caches)."""

from __future__ import annotations

import numpy as np
import torch

from launcher.data.sequence import IGNORE_INDEX, Sample


class PaddedRecords:
    """Record i = tokens[offsets[i]:offsets[i+1]]; cut at seq_len + 1 tokens, then padded."""

    def __init__(
        self,
        tokens: np.ndarray,
        mask: np.ndarray,
        offsets: np.ndarray,
        seq_len: int,
        pad_id: int = 0,
    ) -> None:
        self.tokens, self.mask, self.offsets = tokens, mask, offsets
        self.seq_len, self.pad_id = seq_len, pad_id

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, index: int) -> Sample:
        if not 0 <= index < len(self):
            raise IndexError(index)
        start = int(self.offsets[index])
        end = min(int(self.offsets[index + 1]), start + self.seq_len + 1)
        ids = torch.from_numpy(np.asarray(self.tokens[start:end], dtype=np.int64))
        trained = torch.from_numpy(np.asarray(self.mask[start + 1 : end], dtype=np.bool_))
        n = len(ids) - 1
        inputs = torch.full((self.seq_len,), self.pad_id, dtype=torch.long)
        targets = torch.full((self.seq_len,), IGNORE_INDEX, dtype=torch.long)
        inputs[:n] = ids[:-1]
        targets[:n] = torch.where(trained, ids[1:], IGNORE_INDEX)
        return Sample(inputs, targets)

    def eval_problems(self) -> list[tuple[bytes, bytes]]:
        return []
