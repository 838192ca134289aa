"""Exact-match accuracy on held-out problems by greedy decoding with the generation engine
(launcher/serve/engine.py). Every rank runs it, in the same order, so sharded engines can gather
their parameters; rank 0 reports on stdout, beside the training's progress lines: what it
scores and the key that sets how many, then its progress.

Its cost is bounded by data.eval_problems: by default all 256 held-out problems for a model
decoded with a KV cache (the built-in GPT, transformers models), the first 32 for any other model
(no cache: each new token reruns the whole sequence), and never more than the sequences the run
trained on (train.steps x batch.global_size), so that a short run's evaluation is short too.
"""

from __future__ import annotations

from typing import TextIO

import torch
from torch import nn

from launcher.config.data import DataConfig
from launcher.serve.adapters import RecomputeAdapter, adapter_for
from launcher.serve.engine import Engine, Request
from launcher.tracking.eval_progress import EvalProgress

EVAL_SLOTS = 16
"""Problems decoded at once (continuous batching; the answers do not depend on it)."""


def announce(scored: int, held: int, cached: bool, chosen: bool, trained: int | None = None) -> str:
    """The line that says what the evaluation decodes, and the key that sets how much. trained:
    the sequences the run trained on, which bound the default."""
    of = f"{scored} of {held}" if scored < held else f"{scored}"
    why = ""
    if not chosen and trained is not None and scored == trained < held:
        why = f"; by default no more than the {trained} sequences the run trained on"
    elif not (cached or chosen):
        why = (
            "; this model decodes without a KV cache (each token reruns the whole sequence), so "
            "the default is bounded"
        )
    return (
        f"eval: exact match of greedy decoding on {of} held-out problems{why} "
        f"(data.eval_problems=N sets how many)"
    )


@torch.no_grad()
def exact_match(
    model: nn.Module,
    problems: list[tuple[bytes, bytes]],
    seq_len: int,
    device: torch.device,
    data: DataConfig | None = None,
    report: TextIO | None = None,
    trained: int | None = None,
) -> float | None:
    """Fraction of the scored problems whose greedy continuation equals the expected completion.

    data: data.eval_problems bounds how many are scored (None: all). report: where rank 0 writes
    the announcement and progress lines (None: silent). trained: the sequences the run trained on,
    which bound the default number (None: no bound)."""
    if not problems:
        return None
    was_training = model.training
    model.eval()
    slots = min(EVAL_SLOTS, len(problems))
    adapter = adapter_for(model, slots, seq_len, device)
    cached = not isinstance(adapter, RecomputeAdapter)
    scored = problems if data is None else problems[: data.scored_problems(cached, trained)]
    if report is not None:
        chosen = data is None or data.eval_problems is not None
        report.write(announce(len(scored), len(problems), cached, chosen, trained) + "\n")
    progress = EvalProgress(len(scored), report) if report is not None else None
    # Only problems whose answer fits the context can be answered (the last token is not fed).
    fits = [(p, a) for p, a in scored if len(p) + len(a) - 1 <= seq_len]
    if progress is not None:
        progress.advance(len(scored) - len(fits))  # counted as wrong, nothing to decode
    correct = 0
    if fits:
        engine = Engine(adapter, slots)
        requests = [engine.submit(Request(list(p), len(a), tag=a)) for p, a in fits]
        while engine.pending():
            finished = engine.step()
            if progress is not None:
                progress.advance(len(finished))
        # ids, not bytes(): a model whose vocabulary is larger than the bytes may answer a token
        # past 255, which is wrong, not an error
        correct = sum(r.output_ids == list(a) for r, (_, a) in zip(requests, fits, strict=True))
    model.train(was_training)
    return correct / len(scored)
