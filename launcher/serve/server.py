"""`launch serve`: an OpenAI-compatible HTTP server (FastAPI on uvicorn) in front of the engine.

POST /v1/completions and /v1/chat/completions (streamed as server-sent events with stream=true),
GET /v1/models and /health. Every parameter is either implemented or refused with a 400 naming
it (docs/serve.md has the table); every error is in OpenAI's shape. A full queue answers 503 with
Retry-After (a request that could never fit is a 400); a client that goes away has its requests
cancelled and their slots freed. A request the engine fails is a 500 for it alone; an engine that
cannot go on is named on /health (503) while the process exits for its supervisor to restart it.
"""

# No `from __future__ import annotations`: FastAPI reads the handlers' annotations at runtime.
import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Callable
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI
from fastapi import Request as HttpRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException

from launcher.config.serve import ServeConfig
from launcher.serve import openai_format as fmt
from launcher.serve.body import parse_json, read_body
from launcher.serve.codec import Codec
from launcher.serve.engine import QueueFull, Request
from launcher.serve.openai_errors import ApiError, busy, error
from launcher.serve.openai_params import Job, Limits, chat_job, completion_job
from launcher.serve.worker import EngineThread

SHUTTING_DOWN = "the server is shutting down; retry on another instance."
ENGINE_FAILED = "the engine failed ({}); this server is exiting so that its supervisor restarts it."


@dataclass
class ServeState:
    worker: EngineThread
    codec: Codec
    serve: ServeConfig
    prompt_limit: int
    model_name: str
    accepting: bool = True
    vocab: int | None = None
    inflight: int = 0
    """HTTP requests being answered (a drain waits for none)."""
    created: int = 0

    @property
    def limits(self) -> Limits:
        return Limits(self.serve, self.model_name, self.prompt_limit, self.vocab)

    def refusal(self) -> JSONResponse | None:
        """The 503 while the engine has failed for good or the server drains; None: serving."""
        failed = self.worker.error
        if failed is not None:
            why = f"{type(failed).__name__}: {failed}"
            return error(503, ENGINE_FAILED.format(why), code="engine_failed")
        return None if self.accepting else busy(SHUTTING_DOWN)


def _submit(state: ServeState, requests: list[Request]) -> None:
    """Hand every request to the engine, or none (503 when the queue cannot hold them all)."""
    taken: list[Request] = []
    try:
        for request in requests:
            state.worker.submit(request)
            taken.append(request)
    except QueueFull:
        for request in taken:
            request.cancelled = True
        raise ApiError(
            f"the queue is full ({state.serve.queue} requests waiting); retry later.",
            status=503,
            code="server_busy",
        ) from None


def _threadsafe(loop: asyncio.AbstractEventLoop, call: Callable[[], None]) -> None:
    # After a forced stop the event loop may be closed: nobody waits for the answer.
    with suppress(RuntimeError):
        loop.call_soon_threadsafe(call)


async def _disconnected(http: HttpRequest) -> None:
    """Returns when the client goes away (the body has been read: only that message is left)."""
    while (await http.receive())["type"] != "http.disconnect":
        pass


async def _answer(state: ServeState, http: HttpRequest, requests: list[Request]) -> bool:
    """Wait for every request; False when the client went away first (they are cancelled)."""
    loop = asyncio.get_running_loop()
    futures = [loop.create_future() for _ in requests]
    for request, future in zip(requests, futures, strict=True):

        def resolve(f: "asyncio.Future[None]" = future) -> None:
            if not f.done():
                f.set_result(None)

        request.on_done = lambda _r, resolve=resolve: _threadsafe(loop, resolve)
    _submit(state, requests)
    everything: asyncio.Future[Any] = asyncio.gather(*futures)
    watch: asyncio.Future[Any] = asyncio.ensure_future(_disconnected(http))
    try:
        await asyncio.wait({everything, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if everything.done():
        return True
    everything.cancel()
    # Its CancelledError, taken, or asyncio logs "exception was never retrieved" per client gone.
    everything.add_done_callback(lambda f: f.cancelled() or f.exception())
    for request in requests:
        request.cancelled = True
    return False


def _failure(state: ServeState, requests: list[Request]) -> JSONResponse | None:
    reasons = {r.finish_reason for r in requests}
    if "error" in reasons:
        why = next(r.error for r in requests if r.finish_reason == "error")
        return error(500, f"generation failed: {why}", code="generation_failed")
    if "cancelled" in reasons:
        return busy(SHUTTING_DOWN)
    return None


def _wire_stream(requests: list[Request]) -> "asyncio.Queue[tuple[int, bool]]":
    """(choice, finished) events from the engine's thread, for each token and each end."""
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[tuple[int, bool]] = asyncio.Queue()
    for index, request in enumerate(requests):
        request.on_token = lambda _r, i=index: _threadsafe(
            loop, lambda: events.put_nowait((i, False))
        )
        request.on_done = lambda _r, i=index: _threadsafe(
            loop, lambda: events.put_nowait((i, True))
        )
    return events


async def _stream(
    state: ServeState,
    job: Job,
    requests: list[Request],
    events: "asyncio.Queue[tuple[int, bool]]",
    chat: bool,
    ident: str,
) -> AsyncIterator[bytes]:
    """The events of every choice as tokens arrive. If the client goes away the generator is
    closed, and the requests are cancelled."""
    texts = [fmt.StreamText(state.codec, job.stop) for _ in requests]
    name = state.model_name
    state.inflight += 1  # the stream outlives its handler
    try:
        if chat:
            for index in range(len(requests)):
                yield fmt.event(fmt.chunk(chat, name, ident, index, None, None))
        left = len(requests)
        while left:
            index, finished = await events.get()
            request = requests[index]
            if not finished:
                new = texts[index].advance(list(request.output_ids))
                if new:
                    yield fmt.event(fmt.chunk(chat, name, ident, index, new, None))
                continue
            left -= 1
            if request.finish_reason in ("error", "cancelled"):
                failed = request.finish_reason == "error"
                message = f"generation failed: {request.error}" if failed else SHUTTING_DOWN
                yield fmt.event({"error": {"message": message, "type": "server_error"}})
                return
            rest = texts[index].finish(request.text or "")
            if rest:
                yield fmt.event(fmt.chunk(chat, name, ident, index, rest, None))
            yield fmt.event(fmt.chunk(chat, name, ident, index, "", request.finish_reason))
        if job.include_usage:
            yield fmt.event(fmt.usage_chunk(chat, name, ident, fmt.usage(job, requests)))
        yield fmt.event("[DONE]")
    finally:
        state.inflight -= 1
        for request in requests:
            request.cancelled = True  # a no-op for those already done


def _routes(app: FastAPI, state: ServeState) -> None:
    numbers = itertools.count(1)

    async def handle(http: HttpRequest, chat: bool) -> Any:
        number, serve = next(numbers), state.serve
        ident = f"{'chatcmpl' if chat else 'cmpl'}-{number}"
        state.inflight += 1
        try:
            body = parse_json(
                await read_body(http, serve.max_body_bytes, serve.body_timeout_seconds)
            )
            build = chat_job if chat else completion_job
            job = build(body, state.codec, state.limits, state.serve.seed + number)
            refused = state.refusal()
            if refused is not None:
                return refused
            requests = job.requests()
            if job.stream:
                events = _wire_stream(requests)
                _submit(state, requests)  # a full queue is still a plain 503
                stream = _stream(state, job, requests, events, chat, ident)
                return StreamingResponse(stream, media_type="text/event-stream")
            if not await _answer(state, http, requests):
                return error(400, "the client went away.")
            failed = _failure(state, requests)
            if failed is not None:
                return failed
            if chat:
                return fmt.chat_completion(job, state.model_name, ident, requests)
            return fmt.completion(job, state.codec, state.model_name, ident, requests)
        except ApiError as exc:
            return exc.response()
        finally:
            state.inflight -= 1

    @app.post("/v1/completions")
    async def completions(http: HttpRequest) -> Any:
        return await handle(http, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(http: HttpRequest) -> Any:
        return await handle(http, chat=True)


def create_app(state: ServeState) -> FastAPI:
    app = FastAPI(title="launch serve", docs_url=None, redoc_url=None, openapi_url=None)
    state.created = state.created or int(time.time())

    @app.exception_handler(HTTPException)
    async def http_error(_http: HttpRequest, exc: HTTPException) -> JSONResponse:
        return error(exc.status_code, str(exc.detail))

    @app.exception_handler(RequestValidationError)
    async def invalid(_http: HttpRequest, exc: RequestValidationError) -> JSONResponse:
        return error(422, str(exc))

    @app.exception_handler(Exception)
    async def unexpected(_http: HttpRequest, exc: Exception) -> JSONResponse:
        # Never reached by a request's input (tests/unit/test_serve_fuzz.py); the shape holds.
        return error(500, f"internal error: {type(exc).__name__}: {exc}")

    @app.get("/health")
    async def health() -> Any:
        refused = state.refusal()
        if refused is not None:
            return refused
        engine = state.worker.engine
        return {
            "status": "ok",
            "model": state.model_name,
            "slots": engine.slots,
            "active": len(engine.active),
            "waiting": len(engine.waiting),
            "queue": state.serve.queue,
            "cancelled": engine.cancelled,
            "failed": engine.failed,
        }

    @app.get("/v1/models")
    async def models() -> Any:
        return {"object": "list", "data": [_model_card(state)]}

    @app.get("/v1/models/{name:path}")
    async def model(name: str) -> Any:
        if name != state.model_name:
            return error(
                404, f"the model {name!r} does not exist here.", "model", "model_not_found"
            )
        return _model_card(state)

    _routes(app, state)
    return app


def _model_card(state: ServeState) -> dict[str, Any]:
    return {
        "id": state.model_name,
        "object": "model",
        "created": state.created,
        "owned_by": "launch",
    }
