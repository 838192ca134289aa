"""model=hf (a tiny Llama): continuous batching vs one at a time vs static batching in the
engine, then `launch serve`'s HTTP server under a bounded load generator at slots 1, 8, 32.

Engine part: as benchmarks/generation.py (CPU time of one torch thread, the same tokens checked)
on a Llama built from tests/fixtures/tiny_llama.json (random weights, max_position_embeddings
raised to 160 for the workload; end-of-sequence off so each request generates exactly its
max_new_tokens), through HFAdapter's batched decoding.

Server part: the app of `launch serve` (create_app on the same engine, uvicorn on loopback, in
this process) and a load generator of `--clients` threads that send `--http-requests` requests
in all (a bounded load: each client sends its next request when its last one is answered);
latency is send to answer, requests/s is the total over the wall time.

    .venv/bin/python -m benchmarks.serving_hf [--slots 16] [--requests 64] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from benchmarks.generation import compare, pct, table, workload
from benchmarks.interleave import free_port
from launcher.config.serve import ServeConfig
from launcher.serve.adapters import HFAdapter
from launcher.serve.codec import Codec
from launcher.serve.engine import Engine
from launcher.serve.server import ServeState, create_app
from launcher.serve.worker import EngineThread

CONFIG = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "tiny_llama.json"
CONTEXT = 160


def tiny_llama() -> torch.nn.Module:
    import transformers

    from launcher.models.output import return_logits

    fields = json.loads(CONFIG.read_text()) | {"max_position_embeddings": CONTEXT}
    config = transformers.LlamaConfig(**{k: v for k, v in fields.items() if k != "model_type"})
    torch.manual_seed(0)
    return return_logits(transformers.LlamaForCausalLM(config).eval())


def adapter(model: torch.nn.Module, slots: int) -> HFAdapter:
    made = HFAdapter(model, slots)
    made.context = CONTEXT
    return made


def serve_load(model: torch.nn.Module, slots: int, clients: int, total: int) -> dict[str, float]:
    import httpx
    import uvicorn

    codec = Codec(None, None)
    engine = Engine(adapter(model, slots), slots, decode=codec.decode, queue=total)
    serve = ServeConfig(slots=slots, queue=total, max_new_tokens=32)
    state = ServeState(EngineThread(engine), codec, serve, CONTEXT - 32, "tiny-llama", vocab=256)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(state), port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    state.worker.start()
    thread.start()
    while not server.started:
        time.sleep(0.05)
    work = workload(total, seed=1)
    url = f"http://127.0.0.1:{port}/v1/completions"

    def send(i: int) -> float:
        prompt, n = work[i]
        body = {"prompt": bytes(prompt).decode(), "max_tokens": min(n, 32)}
        start = time.perf_counter()
        reply = httpx.post(url, json=body, timeout=300)
        assert reply.status_code == 200, reply.text
        return time.perf_counter() - start

    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        latency = list(pool.map(send, range(total)))
    wall = time.perf_counter() - start
    server.should_exit = True
    thread.join(timeout=30)
    state.worker.stop(timeout=30)
    return {
        "p50": statistics.median(latency),
        "p99": pct(latency, 0.99),
        "rps": total / wall,
        "tokens_per_s": engine.tokens_generated / wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--http-requests", type=int, default=128)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = tiny_llama()
    # Outputs of 8-128 tokens as in generation.py, prompts and outputs cut to the context.
    work = [(p[:24], min(n, CONTEXT - 24)) for p, n in workload(args.requests)]
    tokens = sum(n for _, n in work)
    with torch.no_grad():
        results = compare(lambda slots: adapter(model, slots), work, args.slots)
    params = sum(p.numel() for p in model.parameters())
    print(
        f"engine: {args.requests} requests, {tokens} generated tokens, slots {args.slots}, "
        f"{args.threads} threads, tiny Llama ({params:,} parameters)"
    )
    table(results, tokens)
    print(
        f"\nserver: {args.http_requests} requests from {args.clients} clients (bounded), "
        "max_tokens <= 32"
    )
    print("| slots | p50 latency s | p99 latency s | requests/s | tokens/s (wall) |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for slots in (1, 8, 32):
        got: dict[str, Any] = serve_load(model, slots, args.clients, args.http_requests)
        print(
            f"| {slots} | {got['p50']:.3f} | {got['p99']:.3f} | {got['rps']:.1f} | "
            f"{got['tokens_per_s']:,.0f} |"
        )


if __name__ == "__main__":
    main()
