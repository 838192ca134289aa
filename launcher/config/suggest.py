"""The wording of the launcher's config errors: the nearest names as suggestions, the choices."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def suggestions(word: str, candidates: Iterable[str]) -> list[str]:
    """The nearest candidates: the same last part under another section (`seed` ->
    `train.seed`), else the closest spellings of the whole key or of its last part."""
    candidates = sorted(set(candidates) - {word})
    tail = word.rsplit(".", 1)[-1]
    same_tail = [c for c in candidates if c.rsplit(".", 1)[-1] == tail]
    if same_tail:
        return same_tail[:3]
    scores = {}
    for name in candidates:
        whole = difflib.SequenceMatcher(None, word, name).ratio()
        part = difflib.SequenceMatcher(None, tail, name.rsplit(".", 1)[-1]).ratio() - 0.1
        scores[name] = max(whole, part)
    best = max(scores.values(), default=0.0)
    near = [n for n in candidates if scores[n] >= max(0.6, best - 0.1)]
    return sorted(near, key=lambda n: -scores[n])[:3]


def did_you_mean(names: list[str]) -> str:
    if not names:
        return ""
    return f"did you mean {' or '.join(names)}? "


def help_hint(command: str) -> str:
    return f"`launch {command} --help` lists every key and group."


def choices(values: Iterable[str]) -> str:
    return ", ".join(values)


def one_of(mean: str, options: Iterable[str]) -> str:
    return f"{mean}The choices: {choices(options)}." if mean else f"use one of: {choices(options)}."
