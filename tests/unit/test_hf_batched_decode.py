"""Batched decoding of transformers models (issue 23): every active slot in one forward per
token, each request's greedy tokens equal to the plain full-recompute loop, also when its cache
outgrows the adapter's first buffers (prompts longer than 64 tokens)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from launcher.serve.adapters import HFAdapter, adapter_for
from launcher.serve.engine import Engine, Request
from tests.unit.test_generation_exact import full_recompute

CONTEXT = 120


def test_one_forward_per_step_and_exact_against_full_recompute(one_torch_thread: None) -> None:
    pytest.importorskip("transformers")
    from benchmarks.serving_hf import tiny_llama

    hf = tiny_llama()  # tests/fixtures/tiny_llama.json, context 160, vocab 256
    rows: list[int] = []  # the batch size of each forward

    def record(_module: Any, args: Any, kwargs: Any, _output: Any) -> None:
        ids = kwargs["input_ids"] if "input_ids" in kwargs else args[0]
        rows.append(int(ids.shape[0]))

    hf.register_forward_hook(record, with_kwargs=True)
    adapter = adapter_for(hf, 4, CONTEXT)
    assert isinstance(adapter, HFAdapter)
    engine = Engine(adapter, 4)
    rng = random.Random(5)
    work = [
        ([rng.randrange(256) for _ in range(rng.randint(1, 80))], rng.randint(1, 24))
        for _ in range(9)
    ]
    requests = [engine.submit(Request(p, n)) for p, n in work]
    engine.run()
    assert adapter.batched and adapter.keys[0].shape[2] > 64  # the buffers grew
    # One forward per prefill and at most one per step; slot by slot would need one per row.
    assert len(rows) <= len(work) + engine.steps and max(rows) > 1
    for request, (prompt, n) in zip(requests, work, strict=True):
        assert request.output_ids == full_recompute(hf, prompt, n, CONTEXT)
