"""The built-in task: reverse a short string. Generated from (seed, index); nothing to download.

"abc|" -> "cba." : prompt tokens are masked, so the valid-token count varies with the length.
About 10% of all strings (by a hash of the string) are held out for evaluation and never trained on.
"""

from __future__ import annotations

import random
import zlib

from launcher.config.data import DataConfig
from launcher.data.sequence import Sample, encode_pair

SEPARATOR, END = "|", "."


def is_held_out(text: str) -> bool:
    return zlib.crc32(text.encode()) % 10 == 0


class ReverseDataset:
    def __init__(self, cfg: DataConfig, seq_len: int, seed: int) -> None:
        self.cfg, self.seq_len, self.seed = cfg, seq_len, seed

    def __len__(self) -> int:
        return 0  # unbounded: sample i is a pure function of (seed, i)

    def _draw(self, rng: random.Random, held_out: bool) -> str:
        while True:
            n = rng.randint(self.cfg.min_len, self.cfg.max_len)
            text = "".join(rng.choice(self.cfg.alphabet) for _ in range(n))
            if is_held_out(text) == held_out:
                return text

    @staticmethod
    def problem(text: str) -> tuple[bytes, bytes]:
        return (text + SEPARATOR).encode(), (text[::-1] + END).encode()

    def __getitem__(self, index: int) -> Sample:
        text = self._draw(random.Random(f"train:{self.seed}:{index}"), held_out=False)
        return encode_pair(*self.problem(text), self.seq_len)

    def eval_problems(self) -> list[tuple[bytes, bytes]]:
        rng = random.Random(f"eval:{self.seed}")
        seen: dict[str, None] = {}
        for _ in range(self.cfg.held_out_problems * 20):
            if len(seen) == self.cfg.held_out_problems:
                break
            seen.setdefault(self._draw(rng, held_out=True))
        return [self.problem(t) for t in seen]
