"""The generation engine: a fixed number of slots, each holding one request and its own KV cache,
filled by continuous batching.

Each iteration (`step`): every waiting request that finds a free slot is admitted and prefilled
(its prompt runs alone into its slot, giving its first token); then every active request takes
one decode step together; a request retires at its end-of-sequence token, a stop string or its
token limit (max_new_tokens, or the model's context), and its slot is free for the next one at
once. A request's tokens depend only on its own prompt, sampling settings and seed: the slot it
lands in, its neighbours and when it arrived change nothing (tests/unit/test_generation_exact.py).

Thread-safety: `submit` and `pending` may be called from any thread; `step` from one thread only.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from launcher.serve.adapters import Adapter
from launcher.serve.logprobs import Scored, score, score_prompt
from launcher.serve.sampling import Sampling, choose

Decode = Callable[[list[int]], str]


@dataclass(eq=False)
class Request:
    prompt_ids: list[int]
    max_new_tokens: int
    sampling: Sampling = field(default_factory=Sampling)
    stop: tuple[str, ...] = ()
    """Strings that end the completion (not included in it)."""
    on_done: Callable[[Request], None] | None = None
    """Called (on the engine's thread) when the request retires."""
    tag: object = None
    """The caller's own reference (an input line, an HTTP request)."""
    logprobs: int | None = None
    """Score each generated token, with this many most likely alternatives (None: no scores)."""
    echo: bool = False
    """Score the prompt's tokens too (with `logprobs` alternatives, 0 when None)."""
    on_token: Callable[[Request], None] | None = None
    """Called (on the engine's thread) after each generated token (streaming)."""
    cancelled: bool = False
    """Set from any thread when nobody waits for the answer: the engine drops the request at its
    next step and frees its slot."""
    # Filled in by the engine:
    output_ids: list[int] = field(default_factory=list)
    text: str | None = None
    """The completion, cut before a stop string (None: the engine has no decoder)."""
    finish_reason: str | None = None
    """"stop" (end-of-sequence token or stop string), "length" (token limit or context), or
    "cancelled"."""
    prompt_scores: list[Scored] = field(default_factory=list)
    output_scores: list[Scored] = field(default_factory=list)
    submitted_at: float = 0.0
    first_token_at: float | None = None
    finished_at: float | None = None
    slot: int | None = None

    @property
    def done(self) -> bool:
        return self.finish_reason is not None


class QueueFull(Exception):
    """Raised by Engine.submit when `queue` requests are already waiting."""


class Engine:
    def __init__(
        self,
        adapter: Adapter,
        slots: int,
        *,
        eos_id: int | None = None,
        decode: Decode | None = None,
        queue: int | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.adapter, self.slots, self.eos_id, self.decode = adapter, slots, eos_id, decode
        self.queue_limit, self.clock = queue, clock
        self.waiting: deque[Request] = deque()
        self.active: dict[int, Request] = {}
        self.generators: dict[int, torch.Generator | None] = {}
        self.lock = threading.Lock()
        self.tokens_generated = 0
        self.steps = 0
        self.cancelled = 0
        """Requests dropped because nobody waited for them any more."""

    @property
    def context(self) -> int:
        return self.adapter.context

    def submit(self, request: Request) -> Request:
        """Queue a request (any thread). Raises QueueFull when `queue` requests wait beyond
        the free slots (the engine then holds slots + queue requests)."""
        if not request.prompt_ids:
            raise ValueError("a request needs at least one prompt token")
        if len(request.prompt_ids) > self.context:
            raise ValueError(
                f"the prompt has {len(request.prompt_ids)} tokens; the context holds {self.context}"
            )
        with self.lock:
            held = len(self.waiting) + len(self.active)
            if self.queue_limit is not None and held >= self.slots + self.queue_limit:
                raise QueueFull
            request.submitted_at = self.clock()
            self.waiting.append(request)
        return request

    def pending(self) -> int:
        """Requests waiting or being decoded."""
        with self.lock:
            return len(self.waiting) + len(self.active)

    def drain_waiting(self) -> list[Request]:
        """Take every request still waiting for a slot (a shutdown rejects them)."""
        with self.lock:
            taken = list(self.waiting)
            self.waiting.clear()
        return taken

    # -- one iteration ----------------------------------------------------------------------------

    @torch.no_grad()
    def step(self) -> list[Request]:
        """Admit and prefill what fits, then one decode step for every active request; the
        requests that retired in this iteration."""
        finished = self._drop_cancelled()
        finished += self._admit()
        if self.active:
            slots = sorted(self.active)
            requests = [self.active[s] for s in slots]
            tokens = [r.output_ids[-1] for r in requests]
            positions = [len(r.prompt_ids) + len(r.output_ids) - 1 for r in requests]
            logits = self.adapter.decode(slots, tokens, positions)
            for row, (slot, request) in enumerate(zip(slots, requests, strict=True)):
                if self._append(slot, request, logits[row]):
                    finished.append(request)
        self.steps += 1
        return finished

    def run(self) -> list[Request]:
        """Step until nothing is waiting or active; every request retired, in retirement order."""
        done: list[Request] = []
        while self.pending():
            done += self.step()
        return done

    def _drop_cancelled(self) -> list[Request]:
        dropped = [(s, r) for s, r in self.active.items() if r.cancelled]
        for slot, request in dropped:
            self._retire(slot, request, "cancelled")
        return [r for _, r in dropped]

    def _admit(self) -> list[Request]:
        finished = []
        free = [s for s in range(self.slots) if s not in self.active]
        while free:
            with self.lock:
                if not self.waiting:
                    break
                request = self.waiting.popleft()
            if request.cancelled:
                self._retire(None, request, "cancelled")
                finished.append(request)
                continue
            slot = free.pop(0)
            request.slot = slot
            self.active[slot] = request
            self.generators[slot] = request.sampling.generator()
            logits = self.adapter.prefill(slot, request.prompt_ids, every=request.echo)
            if request.echo:
                request.prompt_scores = score_prompt(
                    logits, request.prompt_ids, request.logprobs or 0
                )
                logits = logits[-1]
            if request.max_new_tokens == 0:  # scoring the prompt only (echo)
                self._retire(slot, request, "length")
            elif not self._append(slot, request, logits):
                continue
            finished.append(request)
            free.insert(0, slot)
        return finished

    def _append(self, slot: int, request: Request, logits: torch.Tensor) -> bool:
        """Choose the request's next token; retire it when it is done. True: retired."""
        token = choose(logits, request.sampling, self.generators[slot])
        if request.first_token_at is None:
            request.first_token_at = self.clock()
        reason = None
        if self.eos_id is not None and token == self.eos_id:
            reason = "stop"
        else:
            request.output_ids.append(token)
            if request.logprobs is not None:
                request.output_scores.append(score(logits, token, request.logprobs))
            self.tokens_generated += 1
            if request.on_token is not None:
                request.on_token(request)
            if request.stop and self.decode is not None:
                text = self.decode(request.output_ids)
                if any(s in text for s in request.stop):
                    reason = "stop"
            if reason is None and (
                len(request.output_ids) >= request.max_new_tokens
                or len(request.prompt_ids) + len(request.output_ids) > self.context
            ):
                reason = "length"
        if reason is None:
            return False
        self._retire(slot, request, reason)
        return True

    def _retire(self, slot: int | None, request: Request, reason: str) -> None:
        self.cancelled += reason == "cancelled"
        if slot is not None:
            del self.active[slot]
            self.generators.pop(slot, None)
        request.finish_reason = reason
        request.finished_at = self.clock()
        if self.decode is not None:
            text = self.decode(request.output_ids)
            cuts = [text.find(s) for s in request.stop if s in text]
            request.text = text[: min(cuts)] if cuts else text
        if request.on_done is not None:
            request.on_done(request)
