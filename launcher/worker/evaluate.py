"""Exact-match accuracy on held-out problems by greedy decoding (every rank runs it, so sharded
engines can gather their parameters; rank 0 reports)."""

from __future__ import annotations

from collections import defaultdict

import torch
from torch import nn


@torch.no_grad()
def exact_match(
    model: nn.Module, problems: list[tuple[bytes, bytes]], seq_len: int, device: torch.device
) -> float | None:
    """Fraction of problems whose greedy continuation equals the expected completion."""
    if not problems:
        return None
    was_training = model.training
    model.eval()
    # Same prompt and answer length -> one batch; no padding games needed.
    groups: dict[tuple[int, int], list[tuple[bytes, bytes]]] = defaultdict(list)
    for prompt, answer in problems:
        if len(prompt) + len(answer) - 1 <= seq_len:
            groups[(len(prompt), len(answer))].append((prompt, answer))
    correct = 0
    for (_, answer_len), group in sorted(groups.items()):
        ids = torch.tensor([list(p) for p, _ in group], dtype=torch.long, device=device)
        for _ in range(answer_len):
            logits = model(ids)
            ids = torch.cat([ids, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        got = ids[:, -answer_len:].tolist()
        correct += sum(bytes(g) == a for g, (_, a) in zip(got, group, strict=True))
    model.train(was_training)
    return correct / len(problems)
