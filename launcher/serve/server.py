"""`launch serve`: an HTTP server (FastAPI on uvicorn) in front of the engine.

POST /v1/completions takes the OpenAI completions shape ({"prompt", "max_tokens", "temperature",
"top_p", "top_k", "seed", "stop"}) and answers {"choices": [{"text", "finish_reason"}],
"usage": {...}}; streaming is not offered (stream=true is a 400). GET /health reports the slots
and the queue. A full queue answers 503 with Retry-After; an oversized or malformed request 400
with the reason. SIGTERM: stop accepting, finish every request held, exit 0.
"""

# No `from __future__ import annotations`: FastAPI reads the handlers' annotations at runtime.
import asyncio
import itertools
import json
import math
import time
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI
from fastapi import Request as HttpRequest
from fastapi.responses import JSONResponse

from launcher.config.serve import ServeConfig
from launcher.serve.codec import Codec
from launcher.serve.engine import QueueFull, Request
from launcher.serve.sampling import Sampling
from launcher.serve.worker import EngineThread

RETRY_AFTER_S = 1


class BadRequest(Exception):
    pass


@dataclass
class ServeState:
    worker: EngineThread
    codec: Codec
    serve: ServeConfig
    prompt_limit: int
    model_name: str
    accepting: bool = True


def _number(body: dict[str, Any], key: str, default: float, low: float, high: float) -> float:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise BadRequest(f"{key} must be a number, got {value!r}.")
    if not low <= value <= high:
        raise BadRequest(f"{key} must be in [{low}, {high}], got {value}.")
    return float(value)


def _integer(body: dict[str, Any], key: str, default: int, low: int, high: int) -> int:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"{key} must be an integer, got {value!r}.")
    if not low <= value <= high:
        raise BadRequest(f"{key} must be between {low} and {high}, got {value}.")
    return value


def _prompt(body: dict[str, Any]) -> str:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]  # OpenAI accepts a list; one prompt per request here
    if not isinstance(prompt, str) or not prompt:
        raise BadRequest('"prompt" must be a non-empty string.')
    return prompt


def _stop(body: dict[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str) and stop:
        return (stop,)
    if isinstance(stop, list) and all(isinstance(s, str) and s for s in stop):
        return tuple(stop)
    raise BadRequest('"stop" must be a string or a list of non-empty strings.')


def build_request(state: "ServeState", body: Any, seed: int) -> Request:
    """A validated engine request from a request body (BadRequest says why not)."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object.")
    if body.get("stream"):
        raise BadRequest("streaming is not supported; leave out stream or set it to false.")
    serve = state.serve
    ids = state.codec.encode(_prompt(body))
    if not ids:
        raise BadRequest("the prompt encodes to no tokens.")
    if len(ids) > state.prompt_limit:
        raise BadRequest(
            f"the prompt is {len(ids)} tokens; this server accepts at most {state.prompt_limit}."
        )
    max_tokens = _integer(body, "max_tokens", serve.max_new_tokens, 1, 1 << 31)
    if max_tokens > serve.max_new_tokens:
        raise BadRequest(
            f"max_tokens is {max_tokens}; this server generates at most {serve.max_new_tokens} "
            "(serve.max_new_tokens)."
        )
    sampling = Sampling(
        temperature=_number(body, "temperature", serve.temperature, 0.0, 100.0),
        top_k=_integer(body, "top_k", serve.top_k, 0, 1 << 31),
        top_p=_number(body, "top_p", serve.top_p, 1e-9, 1.0),
        seed=_integer(body, "seed", seed, -(1 << 63), (1 << 63) - 1),
    )
    return Request(ids, max_tokens, sampling, stop=_stop(body))


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_busy"
    return JSONResponse(
        {"error": {"message": message, "type": kind}}, status_code=status, headers=headers
    )


def _completion(state: ServeState, number: int, request: Request) -> dict[str, Any]:
    prompt_tokens, completion_tokens = len(request.prompt_ids), len(request.output_ids)
    return {
        "id": f"cmpl-{number}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": state.model_name,
        "choices": [
            {
                "text": request.text,
                "index": 0,
                "logprobs": None,
                "finish_reason": request.finish_reason,
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def create_app(state: ServeState) -> FastAPI:
    app = FastAPI(title="launch serve", docs_url=None, redoc_url=None)
    numbers = itertools.count(1)

    @app.get("/health")
    async def health() -> Any:
        engine = state.worker.engine
        if not state.accepting or state.worker.error is not None:
            return _error(503, "shutting down", {"Retry-After": str(RETRY_AFTER_S)})
        return {
            "status": "ok",
            "model": state.model_name,
            "slots": engine.slots,
            "active": len(engine.active),
            "waiting": len(engine.waiting),
            "queue": state.serve.queue,
        }

    @app.post("/v1/completions")
    async def completions(http: HttpRequest) -> Any:
        number = next(numbers)
        try:
            body = json.loads(await http.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return _error(400, f"the body is not valid JSON ({exc}).")
        try:
            request = build_request(state, body, state.serve.seed + number)
        except BadRequest as exc:
            return _error(400, str(exc))
        if not state.accepting or state.worker.error is not None:
            return _error(503, "the server is shutting down.", {"Retry-After": str(RETRY_AFTER_S)})
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Request] = loop.create_future()

        def resolve(done: Request) -> None:
            if not future.done():  # a client that went away cancels its future
                future.set_result(done)

        def finished(done: Request) -> None:
            # After a forced stop the event loop may be closed: nobody waits for the answer.
            with suppress(RuntimeError):
                loop.call_soon_threadsafe(resolve, done)

        request.on_done = finished
        try:
            state.worker.submit(request)
        except QueueFull:
            return _error(
                503,
                f"the queue is full ({state.serve.queue} requests waiting); retry later.",
                {"Retry-After": str(RETRY_AFTER_S)},
            )
        done = await future
        if done.finish_reason == "error":
            return _error(500, f"generation failed: {state.worker.error!r}")
        if done.finish_reason == "cancelled":
            return _error(503, "the server is shutting down.", {"Retry-After": str(RETRY_AFTER_S)})
        return _completion(state, number, done)

    return app
