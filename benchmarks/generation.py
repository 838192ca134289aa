"""Continuous batching vs one request at a time vs static batching, on the 2-core CPU.

64 requests of mixed prompt (4-64 tokens) and output (8-128 tokens) lengths, all arriving at
once, greedy, fp32, on the built-in GPT (model=small: 6 layers, d_model 384, seq_len 256, random
weights; the end-of-sequence token is off so every request generates exactly its max_new_tokens).

- continuous: the engine (launcher/serve/engine.py) with serve.slots slots; a finished request's
  slot takes the next waiting one at once.
- one at a time: the same engine with one slot.
- static: groups of `slots` requests in arrival order; each group decodes together until its
  longest request is done (finished rows keep being computed: the padding), and its requests
  are answered only when the whole group is.

Latency is arrival to answer. Every time is the process's CPU time (time.process_time, one torch
thread): on a 2-core machine shared with other work, wall time measures the neighbours as much
as the method; CPU time of a one-thread process does not. The wall time is printed too. The
three methods are also checked to give the same tokens.

    .venv/bin/python -m benchmarks.generation [--slots 16] [--requests 64] [--threads 1]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from launcher.config.model import ModelConfig
from launcher.models.gpt import GPT
from launcher.serve.adapters import Adapter, GPTAdapter
from launcher.serve.engine import Engine, Request

CLOCK = time.process_time
SMALL = ModelConfig(name="small", n_layer=6, n_head=6, d_model=384, seq_len=256)


def workload(n: int, seed: int = 0) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    return [
        ([rng.randrange(32, 127) for _ in range(rng.randint(4, 64))], rng.randint(8, 128))
        for _ in range(n)
    ]


MakeAdapter = Callable[[int], Adapter]
"""slots -> the adapter of the model under test."""


def run_engine(
    make: MakeAdapter, work: list[tuple[list[int], int]], slots: int
) -> tuple[float, list[float], list[list[int]]]:
    engine = Engine(make(slots), slots, clock=CLOCK)
    start = CLOCK()
    requests = [engine.submit(Request(list(p), n)) for p, n in work]
    engine.run()
    cpu = CLOCK() - start
    latency = [(r.finished_at or 0.0) - start for r in requests]
    return cpu, latency, [r.output_ids for r in requests]


@torch.no_grad()
def run_static(
    make: MakeAdapter, work: list[tuple[list[int], int]], group: int
) -> tuple[float, list[float], list[list[int]]]:
    adapter = make(group)
    start = CLOCK()
    latency: list[float] = []
    outputs: list[list[int]] = []
    for lo in range(0, len(work), group):
        batch = work[lo : lo + group]
        outs = [[int(adapter.prefill(s, p).argmax())] for s, (p, _) in enumerate(batch)]
        longest = max(n for _, n in batch)
        for _ in range(longest - 1):
            slots = list(range(len(batch)))
            # Every row decodes until the longest is done; a finished row's extra tokens are
            # dropped (its position is held at its last one: the computation is the padding).
            positions = [
                min(len(p) + len(o) - 1, adapter.context - 1)
                for (p, _), o in zip(batch, outs, strict=True)
            ]
            logits = adapter.decode(slots, [o[-1] for o in outs], positions)
            for row, ((_, n), out) in enumerate(zip(batch, outs, strict=True)):
                if len(out) < n:
                    out.append(int(logits[row].argmax()))
        done = CLOCK() - start
        latency += [done] * len(batch)
        outputs += outs
    return CLOCK() - start, latency, outputs


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def compare(make: MakeAdapter, work: list[tuple[list[int], int]], slots: int) -> dict[str, Any]:
    """The three methods on one workload, one after another: (CPU s, latencies, outputs, wall s)
    per method."""
    run_engine(make, work[:4], slots)  # warm-up
    results: dict[str, Any] = {}
    for name, method in (
        ("continuous", lambda: run_engine(make, work, slots)),
        ("one at a time", lambda: run_engine(make, work, 1)),
        ("static", lambda: run_static(make, work, slots)),
    ):
        wall = time.perf_counter()
        cpu, latency, outputs = method()
        results[name] = (cpu, latency, outputs, time.perf_counter() - wall)
    return results


def table(results: dict[str, Any], tokens: int) -> None:
    print(
        "| method | CPU s | tokens per CPU s | vs one at a time | p50 latency s | p95 latency s "
        "| same tokens | (wall s) |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: |")
    base, reference = results["one at a time"][0], results["one at a time"][2]
    for name, (cpu, latency, outputs, wall) in results.items():
        print(
            f"| {name} | {cpu:.2f} | {tokens / cpu:,.0f} | {base / cpu:.2f}x | "
            f"{statistics.median(latency):.2f} | {pct(latency, 0.95):.2f} | "
            f"{'yes' if outputs == reference else 'NO'} | {wall:.1f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (2 spin badly on a busy 2-core machine)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = GPT(SMALL).eval()
    work = workload(args.requests)
    tokens = sum(n for _, n in work)
    results = compare(lambda slots: GPTAdapter(model, slots), work, args.slots)
    print(
        f"{args.requests} requests, {tokens} generated tokens, slots {args.slots}, "
        f"{args.threads} threads, model=small ({sum(p.numel() for p in model.parameters()):,} "
        "parameters)"
    )
    table(results, tokens)


if __name__ == "__main__":
    main()
