"""The input of `launch generate`: one JSON object per line, checked before anything is loaded
onto the device; every bad line is one error naming its line number."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher.errors import ConfigError

KEY = "PROMPTS.jsonl"
EXAMPLE = '{"prompt": "abc|", "max_new_tokens": 8}'


@dataclass
class PromptLine:
    number: int
    record: dict[str, Any]
    prompt: str
    max_new_tokens: int | None = None
    stop: tuple[str, ...] = field(default_factory=tuple)
    seed: int | None = None


def _stop_strings(value: Any) -> tuple[str, ...] | None:
    if value is None:
        return ()
    if isinstance(value, str) and value:  # "" would end every completion at once, empty
        return (value,)
    if isinstance(value, list) and all(isinstance(s, str) and s for s in value):
        return tuple(value)
    return None


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _surrogate(value: Any) -> str | None:
    """The first lone surrogate in the strings of a parsed line (keys included), if any."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            return value[exc.start]
        return None
    items = [*value.keys(), *value.values()] if isinstance(value, dict) else value
    if isinstance(items, list):
        for item in items:
            found = _surrogate(item)
            if found is not None:
                return found
    return None


def parse_line(number: int, text: str, where: str) -> PromptLine:
    at = f"{where} line {number}"
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            KEY, f"{at} is not valid JSON ({exc.msg}).", f"one object per line: {EXAMPLE}."
        ) from None
    except RecursionError:
        raise ConfigError(
            KEY, f"{at} nests too deep.", f"one flat object per line: {EXAMPLE}."
        ) from None
    except ValueError:  # an integer literal over Python's limit of digits
        raise ConfigError(
            KEY, f"{at} holds an integer of more than {sys.get_int_max_str_digits()} digits."
        ) from None
    if not isinstance(record, dict) or not isinstance(record.get("prompt"), str):
        raise ConfigError(KEY, f'{at} has no string "prompt".', f"write lines like {EXAMPLE}.")
    limit = record.get("max_new_tokens")
    if limit is not None and not _positive_int(limit):
        raise ConfigError(KEY, f'{at}: "max_new_tokens" must be a positive integer, got {limit!r}.')
    stop = _stop_strings(record.get("stop"))
    if stop is None:
        raise ConfigError(KEY, f'{at}: "stop" must be a string or a list of non-empty strings.')
    bad = _surrogate(record)
    if bad is not None:
        raise ConfigError(
            KEY,
            f"{at} holds a lone surrogate escape (\\u{ord(bad):04x}), which is not Unicode text.",
            "remove it, or escape the whole character (a surrogate pair).",
        )
    seed = record.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise ConfigError(KEY, f'{at}: "seed" must be an integer, got {seed!r}.')
    if seed is not None and not -(1 << 63) <= seed < 1 << 63:  # what torch.Generator takes
        raise ConfigError(KEY, f'{at}: "seed" must be in [-2**63, 2**63).')
    return PromptLine(number, record, record["prompt"], limit, stop, seed)


def read_prompts(path_text: str) -> list[PromptLine]:
    path = Path(path_text).expanduser()
    if not path.is_file():
        why = "does not exist" if not path.exists() else "is not a file"
        raise ConfigError(KEY, f"{path_text} {why}.", f"pass a JSONL file of lines like {EXAMPLE}.")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise ConfigError(
            KEY, f"{path} is not UTF-8 text (bad byte at offset {exc.start})."
        ) from None
    prompts = [parse_line(n, t, str(path)) for n, t in enumerate(lines, start=1) if t.strip()]
    if not prompts:
        raise ConfigError(KEY, f"{path} holds no prompts.", f"add lines like {EXAMPLE}.")
    return prompts
