"""`launch generate`: every prompt of a JSONL file through the engine, the outputs in input
order (stdout or --output), progress and the totals on stderr. A prompt the engine fails is
written with "completion": null and its "error", the others go on; the command then ends with one
line naming how many failed (exit 1). An engine that cannot go on is one line, exit 1."""

from __future__ import annotations

import json
import statistics
import sys
import time
from typing import TextIO

import torch

from launcher.config.serve import ServeConfig
from launcher.errors import ConfigError, LauncherError
from launcher.serve.adapters import adapter_for
from launcher.serve.engine import Engine, EngineBroken, Request
from launcher.serve.load import LoadedRun
from launcher.serve.progress import GenerationProgress
from launcher.serve.prompts import KEY, PromptLine
from launcher.serve.sampling import Sampling


class GenerationFailed(LauncherError):
    """Prompts the engine failed (written with their error), or an engine that broke."""

    exit_code = 1


def build_engine(
    run: LoadedRun, serve: ServeConfig, device: torch.device, queue: int | None = None
) -> Engine:
    """The engine on the run's model (queue: requests that may wait; None: no bound)."""
    adapter = adapter_for(run.model, serve.slots, run.cfg.model.seq_len, device)
    codec = run.codec
    return Engine(adapter, serve.slots, eos_id=codec.eos_id, decode=codec.decode, queue=queue)


def prompt_limit(serve: ServeConfig, context: int) -> int:
    """The longest prompt accepted, in tokens."""
    return min(serve.max_prompt_tokens, context) if serve.max_prompt_tokens else context


def sampling_of(serve: ServeConfig, seed: int) -> Sampling:
    return Sampling(serve.temperature, serve.top_k, serve.top_p, seed)


def to_requests(
    lines: list[PromptLine], run: LoadedRun, serve: ServeConfig, limit: int
) -> list[Request]:
    """One request per line; a prompt that is empty or too long is refused with its line."""
    requests = []
    for index, line in enumerate(lines):
        ids = run.codec.encode(line.prompt)
        if not ids:
            raise ConfigError(KEY, f"line {line.number}: the prompt is empty.", "give it text.")
        if len(ids) > limit:
            raise ConfigError(
                KEY,
                f"line {line.number}: the prompt is {len(ids)} tokens; at most {limit} are "
                "accepted (serve.max_prompt_tokens, or the model's context).",
                "shorten it.",
            )
        seed = line.seed if line.seed is not None else serve.seed + index
        requests.append(
            Request(
                ids,
                line.max_new_tokens or serve.max_new_tokens,
                sampling_of(serve, seed),
                stop=line.stop,
                tag=line,
            )
        )
    return requests


def _write(request: Request, out: TextIO) -> None:
    line = request.tag
    assert isinstance(line, PromptLine)
    record = {**line.record, "completion": request.text}
    if request.finish_reason == "error":
        record["error"] = request.error
    out.write(json.dumps(record, ensure_ascii=False) + "\n")


def generate(
    engine: Engine, requests: list[Request], out: TextIO, err: TextIO | None = None
) -> dict[str, float]:
    """Run every request; write each output line in input order as soon as it and all before it
    are done. Returns the totals (tokens, seconds, tokens/s, time to first token)."""
    err = err or sys.stderr
    progress = GenerationProgress(len(requests), err)
    start = time.perf_counter()
    for request in requests:
        request.submitted_at = start
        engine.waiting.append(request)  # not submit(): the whole file is the queue
    written = 0
    while engine.pending():
        try:
            retired = engine.step()
        except EngineBroken as exc:
            raise GenerationFailed(f"the engine failed after {written} lines: {exc}.") from None
        progress.advance(len(retired), engine.tokens_generated)
        while written < len(requests) and requests[written].done:
            _write(requests[written], out)
            written += 1
    out.flush()
    seconds = time.perf_counter() - start
    tokens = sum(len(r.output_ids) for r in requests)
    first = [r.first_token_at - r.submitted_at for r in requests if r.first_token_at is not None]
    totals = {
        "requests": len(requests),
        "tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
        "ttft_first_s": min(first, default=0.0),
        "ttft_median_s": statistics.median(first) if first else 0.0,
    }
    err.write(
        f"{tokens} tokens in {seconds:.2f}s: {totals['tokens_per_s']:,.0f} tokens/s; time to "
        f"first token {totals['ttft_first_s'] * 1000:.0f} ms (first request), "
        f"{totals['ttft_median_s'] * 1000:.0f} ms (median over {len(requests)} requests, "
        f"queueing included)\n"
    )
    return totals


def check_failures(requests: list[Request]) -> None:
    """After the output is complete: GenerationFailed when the engine failed any prompt."""
    failed = [r for r in requests if r.finish_reason == "error"]
    if failed:
        first = failed[0].tag
        assert isinstance(first, PromptLine)
        raise GenerationFailed(
            f'{len(failed)} of {len(requests)} prompts failed (written with their "error"; '
            f"the first, line {first.number}: {failed[0].error})."
        )
