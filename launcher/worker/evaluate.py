"""Exact-match accuracy on held-out problems by greedy decoding with the generation engine
(launcher/serve/engine.py). Every rank runs it, in the same order, so sharded engines can gather
their parameters; rank 0 reports."""

from __future__ import annotations

import torch
from torch import nn

from launcher.serve.adapters import adapter_for
from launcher.serve.engine import Engine, Request

EVAL_SLOTS = 16
"""Problems decoded at once (continuous batching; the answers do not depend on it)."""


@torch.no_grad()
def exact_match(
    model: nn.Module, problems: list[tuple[bytes, bytes]], seq_len: int, device: torch.device
) -> float | None:
    """Fraction of problems whose greedy continuation equals the expected completion."""
    if not problems:
        return None
    was_training = model.training
    model.eval()
    # Only problems whose answer fits the context can be answered (the last token is not fed).
    fits = [(p, a) for p, a in problems if len(p) + len(a) - 1 <= seq_len]
    correct = 0
    if fits:
        slots = min(EVAL_SLOTS, len(fits))
        engine = Engine(adapter_for(model, slots, seq_len, device), slots)
        requests = [engine.submit(Request(list(p), len(a), tag=a)) for p, a in fits]
        engine.run()
        correct = sum(bytes(r.output_ids) == r.tag for r in requests)
    model.train(was_training)
    return correct / len(problems)
