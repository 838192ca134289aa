"""The end-of-run exact match scores a model whose vocabulary is larger than the 256 bytes
(`model.vocab_size=4096` on the reversal task): a token past 255 is a wrong answer, not a crash
after training (it raised `ValueError: bytes must be in range(0, 256)`, exit 1, no summary.json)."""

from __future__ import annotations

import torch
from torch import nn

from launcher.worker.evaluate import exact_match


class Answers(nn.Module):
    """Greedy decoding gives `token` at every position."""

    def __init__(self, token: int, vocab_size: int = 512) -> None:
        super().__init__()
        self.token, self.vocab_size = token, vocab_size
        self.unused = nn.Parameter(torch.zeros(1))  # a device and dtype to read

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        logits = torch.zeros(*input_ids.shape, self.vocab_size)
        logits[..., self.token] = 1.0
        return logits


def test_a_token_past_the_bytes_is_wrong_not_an_error() -> None:
    problems = [(b"ab|", b"ba."), (b"xy|", b"aa")]
    assert exact_match(Answers(300), problems, 16, torch.device("cpu")) == 0.0
    assert exact_match(Answers(ord("a")), problems, 16, torch.device("cpu")) == 0.5
