"""The checks of single parameter values of the OpenAI endpoints: numbers, integers, flags, stop
strings, stream options. A value of any size or precision is answered with a 400 naming its key
(a 400-digit integer is compared as an integer, never converted to a float that overflows), and
a value quoted in a message is cut short."""

from __future__ import annotations

import math
from typing import Any

from launcher.serve.openai_errors import ApiError

MAX_STOP = 4
SHOWN = 40
"""Characters of a refused value quoted in its message."""


def shown(value: Any) -> str:
    """A value as a message quotes it: its repr, cut after SHOWN characters."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"an integer of {len(str(abs(value)))} digits"
    text = repr(value)
    return text if len(text) <= SHOWN else text[:SHOWN] + "..."


def number(body: dict[str, Any], key: str, default: float, low: float, high: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    finite = isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))
    if isinstance(value, bool) or not finite:
        raise ApiError(f"{key} must be a number, got {shown(value)}.", key)
    if not low <= value <= high:  # exact for an int of any size: no float conversion
        raise ApiError(f"{key} must be in [{low}, {high}], got {shown(value)}.", key)
    return float(value)


def integer(body: dict[str, Any], key: str, default: int, low: int, high: int) -> int:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(f"{key} must be an integer, got {shown(value)}.", key)
    if not low <= value <= high:
        raise ApiError(f"{key} must be between {low} and {high}, got {shown(value)}.", key)
    return value


def flag(body: dict[str, Any], key: str) -> bool:
    value = body.get(key)
    if value is not None and not isinstance(value, bool):
        raise ApiError(f"{key} must be true or false, got {shown(value)}.", key)
    return bool(value)


def stop_strings(body: dict[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str) and stop:
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise ApiError('"stop" must be a string or a list of non-empty strings.', "stop")
    if len(stop) > MAX_STOP:
        raise ApiError(f'"stop" holds at most {MAX_STOP} strings, got {len(stop)}.', "stop")
    return tuple(stop)


def stream_options(body: dict[str, Any]) -> tuple[bool, bool]:
    """(stream, include_usage)."""
    stream = flag(body, "stream")
    options = body.get("stream_options")
    if options is None:
        return stream, False
    if not stream:
        raise ApiError("stream_options is only allowed with stream=true.", "stream_options")
    if not isinstance(options, dict) or set(options) - {"include_usage"}:
        raise ApiError('stream_options takes only {"include_usage": true|false}.', "stream_options")
    return stream, flag(options, "include_usage")
