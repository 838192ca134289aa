"""Log-probabilities of tokens as OpenAI's completions API reports them: the chosen token's, and
the k most likely tokens' at the same position, from the model's raw logits (before temperature,
top-k or top-p, as OpenAI and vLLM report them)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Scored:
    token: int
    logprob: float | None
    """None for a prompt's first token (nothing comes before it)."""
    top: tuple[tuple[int, float], ...] = ()
    """The k most likely tokens at this position with their log-probabilities, best first."""


def _top(row: torch.Tensor, k: int) -> tuple[tuple[int, float], ...]:
    if k <= 0:
        return ()
    values, ids = torch.topk(row, min(k, row.numel()))
    return tuple((int(i), float(v)) for i, v in zip(ids.tolist(), values.tolist(), strict=True))


def score(logits: torch.Tensor, token: int, k: int) -> Scored:
    """The token chosen after `logits` (vocab,)."""
    row = torch.log_softmax(logits.detach().float(), dim=-1)
    return Scored(token, float(row[token]), _top(row, k))


def score_prompt(logits: torch.Tensor, ids: list[int], k: int) -> list[Scored]:
    """Each prompt token given the ones before it; logits (len(ids), vocab) after each token."""
    rows = torch.log_softmax(logits.detach().float(), dim=-1)
    scored = [Scored(ids[0], None)]
    for position, token in enumerate(ids[1:]):
        row = rows[position]
        scored.append(Scored(token, float(row[token]), _top(row, k)))
    return scored
