"""The generation engine: a fixed number of slots, each holding one request and its own KV cache,
filled by continuous batching.

Each iteration (`step`): every waiting request that finds a free slot is admitted and prefilled
(its prompt runs alone into its slot, giving its first token); then every active request takes
one decode step together; a request retires at its end-of-sequence token, a stop string or its
token limit (max_new_tokens, or the model's context), and its slot is free for the next one at
once. A request's tokens depend only on its own prompt, sampling settings and seed: the slot it
lands in, its neighbours and when it arrived change nothing (tests/unit/test_generation_exact.py).

A failure is the failing requests' alone: an exception while one request is prefilled or has
its token chosen fails that request; one in the batched decode fails the requests of that step.
They retire with finish_reason "error" and the exception in `error`, and the engine goes on. After
a failed step the engine checks itself with a one-token prefill into a free slot: if that fails
too, the engine cannot go on and `step` raises EngineBroken (the server exits for its supervisor
to restart it). An exception that is not an `Exception` (KeyboardInterrupt) is never caught.

Thread-safety: `submit` and `pending` may be called from any thread; `step` from one thread only.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

import torch

from launcher.logs import get_logger
from launcher.serve.adapters import Adapter
from launcher.serve.logprobs import score, score_prompt
from launcher.serve.request import Request
from launcher.serve.sampling import choose

Decode = Callable[[list[int]], str]


class QueueFull(Exception):
    """Raised by Engine.submit when `queue` requests are already waiting."""


class EngineBroken(Exception):
    """The engine cannot go on: a step failed and so did the one-token check after it."""


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


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
        self.failed = 0
        """Requests the engine failed (finish_reason "error")."""

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
        failures: list[Exception] = []
        finished = self._drop_cancelled()
        finished += self._admit(failures)
        if self.active:
            slots = sorted(self.active)
            requests = [self.active[s] for s in slots]
            tokens = [r.output_ids[-1] for r in requests]
            positions = [len(r.prompt_ids) + len(r.output_ids) - 1 for r in requests]
            try:
                logits = self.adapter.decode(slots, tokens, positions)
            except Exception as exc:  # the batched forward: every request of the step fails
                for slot, request in zip(slots, requests, strict=True):
                    finished.append(self._fail(slot, request, exc, failures))
            else:
                for row, (slot, request) in enumerate(zip(slots, requests, strict=True)):
                    try:
                        if self._append(slot, request, logits[row]):
                            finished.append(request)
                    except Exception as exc:
                        finished.append(self._fail(slot, request, exc, failures))
        self.steps += 1
        if failures:
            self._check_itself(failures[0])
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

    def _fail(
        self, slot: int | None, request: Request, exc: Exception, failures: list[Exception]
    ) -> Request:
        """Retire a request the engine could not serve (its slot freed for the next one)."""
        failures.append(exc)
        if slot is not None and self.active.get(slot) is request:
            del self.active[slot]
            self.generators.pop(slot, None)
        if request.done:  # retired before the failure (in its own callback)
            return request
        self.failed += 1
        request.error = _why(exc)
        request.finish_reason = "error"
        request.finished_at = self.clock()
        get_logger().warning(f"generation failed for one request: {request.error}")
        if request.on_done is not None:
            request.on_done(request)
        return request

    def _check_itself(self, cause: Exception) -> None:
        """After a failed step: a one-token prefill into a free slot. Raises EngineBroken when
        that fails too (the model or the device, not a request, is at fault)."""
        free = [s for s in range(self.slots) if s not in self.active]
        if not free:
            return
        try:
            self.adapter.prefill(free[0], [0])
        except Exception as exc:
            raise EngineBroken(
                f"a step failed ({_why(cause)}) and so did a one-token check ({_why(exc)})"
            ) from exc

    def _admit(self, failures: list[Exception]) -> list[Request]:
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
            try:
                if not self._start(slot, request):
                    continue
            except Exception as exc:
                self._fail(slot, request, exc, failures)
            finished.append(request)
            free.insert(0, slot)
        return finished

    def _start(self, slot: int, request: Request) -> bool:
        """Prefill a request into its slot and choose its first token. True: retired."""
        request.slot = slot
        self.active[slot] = request
        self.generators[slot] = request.sampling.generator()
        logits = self.adapter.prefill(slot, request.prompt_ids, every=request.echo)
        if request.echo:
            request.prompt_scores = score_prompt(logits, request.prompt_ids, request.logprobs or 0)
            logits = logits[-1]
            if request.score_next is not None:
                request.next_score = score(logits, request.score_next, request.logprobs or 0)
        if request.max_new_tokens == 0:  # scoring the prompt only (echo)
            self._retire(slot, request, "length")
            return True
        return self._append(slot, request, logits)

    def _append(self, slot: int, request: Request, logits: torch.Tensor) -> bool:
        """Choose the request's next token; retire it when it is done. True: retired."""
        token = choose(logits, request.sampling, self.generators[slot])
        if request.first_token_at is None:
            request.first_token_at = self.clock()
        reason = None
        if self.eos_id is not None and token == self.eos_id:
            reason = "stop"
            request.stop_token = token
            if request.logprobs is not None:
                request.stop_score = score(logits, token, request.logprobs)
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
