"""A request body read safely: its length refused (413) before it is read when the client
declares it, and while reading when it does not; a body that takes longer than
serve.body_timeout_seconds to arrive refused (408, the connection closed); JSON that nests too
deep, an integer longer than Python reads (4,300 digits), or strings that are not Unicode text (a
lone surrogate escape), refused with a 400 instead of reaching a traceback."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from fastapi import Request as HttpRequest
from starlette.requests import ClientDisconnect

from launcher.serve.openai_errors import ApiError

MAX_DEPTH = 32
"""No request of the API nests deeper than a few levels (chat messages: 4)."""


def _too_large(limit: int) -> ApiError:
    return ApiError(
        f"the body is larger than this server accepts ({limit} bytes: serve.max_body_bytes).",
        status=413,
        code="request_too_large",
    )


async def read_body(http: HttpRequest, limit: int, timeout: float) -> bytes:
    """The whole body, received within `timeout` seconds (ApiError 408 when not)."""
    try:
        return await asyncio.wait_for(_read(http, limit), timeout)
    except asyncio.TimeoutError:
        raise ApiError(
            f"the request body did not arrive within {timeout:g} s (serve.body_timeout_seconds).",
            status=408,
            code="request_timeout",
        ) from None


async def _read(http: HttpRequest, limit: int) -> bytes:
    declared = http.headers.get("content-length")
    if declared is not None and not (declared.isascii() and declared.isdigit()):
        raise _too_large(limit)
    if declared is not None and (len(declared) > 18 or int(declared) > limit):
        raise _too_large(limit)
    chunks, size = [], 0
    try:
        async for chunk in http.stream():
            size += len(chunk)
            if size > limit:
                raise _too_large(limit)
            chunks.append(chunk)
    except ClientDisconnect:  # gone mid-body: nobody reads the answer, but no traceback either
        raise ApiError("the client went away before its body arrived.") from None
    return b"".join(chunks)


def _depth_and_text(value: Any, depth: int = 0) -> None:
    if depth > MAX_DEPTH:
        raise ApiError(f"the body nests deeper than {MAX_DEPTH} levels.")
    if isinstance(value, str):
        check_text(value, None)
    elif isinstance(value, dict):
        for key, item in value.items():
            check_text(key, None)
            _depth_and_text(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            _depth_and_text(item, depth + 1)


def check_text(text: str, param: str | None) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ApiError(
            f"a string holds a lone surrogate escape (\\u{ord(text[exc.start]):04x}), which is "
            "not Unicode text.",
            param,
        ) from None


def parse_json(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object (ApiError says why not)."""
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(f"the body is not valid JSON ({exc}).") from None
    except RecursionError:
        raise ApiError(f"the body nests deeper than {MAX_DEPTH} levels.") from None
    except ValueError:  # an integer literal over Python's limit of digits
        raise ApiError(
            f"the body holds an integer of more than {sys.get_int_max_str_digits()} digits."
        ) from None
    if not isinstance(body, dict):
        raise ApiError("the body must be a JSON object.")
    _depth_and_text(body)
    return body
