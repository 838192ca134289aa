"""What counts as a secret, and one way to remove secrets from text and data before they are
written.

A secret is
- the value of an environment variable whose name looks like a credential: WANDB_API_KEY, any
  name ending in _KEY or _TOKEN, or containing SECRET, PASSWORD or PASSWD;
- a value assigned to such a name inside the text or data being written, e.g. the cluster.setup
  line `export HF_TOKEN=hf_abc...` or a flag `--api-key=...`;
- a string under a dict key that looks like a credential (api_key, token, password, ...).

Values shorter than MIN_SECRET_LEN characters are not replaced everywhere: they would match
everywhere (`1`, `true`). A shorter value (at least MIN_ASSIGNED_LEN characters) assigned with `=`
or a flag (`PASSWORD=hunter2`, `--api-key=abcd`) is replaced where it is assigned, and nowhere
else. A shell reference (`HF_TOKEN=$HF_TOKEN`) is not a secret: the shell fills it in at run time;
nor is a placeholder in angle brackets (`export WANDB_API_KEY=<your key>`, as the launcher's own
"Fix:" lines write them, which must reach the user as written). Every secret is replaced by
REDACTED.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

from launcher.userpath import replace_own

REDACTED = "REDACTED"
"""The replacement: a plain word, safe in YAML, JSON and shell scripts alike."""
MIN_SECRET_LEN = 8
"""Values at least this long are replaced wherever they appear."""
MIN_ASSIGNED_LEN = 4
"""Shorter values assigned with `=` or a flag are replaced only where they are assigned."""

T = TypeVar("T")

_SECRET_NAME = re.compile(r"(?:^|_)(?:API_?KEY|KEY|TOKEN)$|SECRET|PASSWORD|PASSWD", re.IGNORECASE)
# NAME=value (shell, .env) or NAME: value, where NAME looks like a credential. A lookahead, so that
# matches overlap: in `--env=HF_TOKEN=hf_x` or `pw: PASSWORD=x` the outer assignment must not hide
# the inner one. A name starts at a word boundary (`MONKEY=` holds no `KEY=`).
_ASSIGNMENT = re.compile(
    r"""(?<![A-Za-z0-9_])(?=(?P<name>[A-Za-z_][A-Za-z0-9_]*)['"]?\s*(?P<op>[=:])\s*(?P<quote>['"]?)(?P<value>[^\s'"]+)(?P=quote))"""
)
# --api-key VALUE, --token=VALUE, --password VALUE
_FLAG = re.compile(
    r"""--(?P<name>[A-Za-z0-9_-]*(?:key|token|secret|password|passwd))(?:=|\s+)(?P<quote>['"]?)(?P<value>[^\s'"-][^\s'"]*)(?P=quote)""",
    re.IGNORECASE,
)
# $NAME or ${NAME}: filled in by the shell that runs the line, not a value.
_SHELL_REFERENCE = re.compile(r"\$(?:[A-Za-z_][A-Za-z0-9_]*|\{[A-Za-z_][A-Za-z0-9_]*\})[;&|)]*")
# <your key>, <token>: words for the reader to replace (a Fix's text), not a value; a key has
# digits or capitals (one in the environment is replaced anywhere all the same).
_PLACEHOLDER = re.compile(r"<[a-z][a-z -]{0,39}>")


def is_secret_name(name: str) -> bool:
    """True for WANDB_API_KEY, HF_TOKEN, AWS_SECRET_ACCESS_KEY, DB_PASSWORD, api_key, ..."""
    return bool(_SECRET_NAME.search(name.replace("-", "_")))


def _long_enough(value: str) -> bool:
    return len(value) >= MIN_SECRET_LEN


def environment_secrets(env: Mapping[str, str] | None = None) -> set[str]:
    """Values of credential-like environment variables."""
    env = os.environ if env is None else env
    return {v for k, v in env.items() if is_secret_name(k) and _long_enough(v)}


def _assignments(text: str) -> Iterator[tuple[re.Match[str], bool]]:
    """Matches of a value assigned to a credential-like name, each with whether it was assigned
    with `=` or a flag (True) or with `:` (False: also prose, `HF_TOKEN: not set`)."""
    for pattern in (_ASSIGNMENT, _FLAG):
        for match in pattern.finditer(text):
            value = match["value"]
            if (
                is_secret_name(match["name"])
                and not _SHELL_REFERENCE.fullmatch(value)
                and not _PLACEHOLDER.match(text, match.start("value"))
            ):
                yield match, pattern is _FLAG or match["op"] == "="


def assigned_secrets(text: str) -> set[str]:
    """Values assigned to credential-like names inside `text` (NAME=value, --token value)."""
    found = set()
    for match, strict in _assignments(text):
        value = match["value"]
        if _long_enough(value) or (strict and len(value) >= MIN_ASSIGNED_LEN):
            found.add(value)
    return found


def secrets_in(obj: Any) -> set[str]:
    """Values assigned to credential-like names inside a string, or dicts and lists of them, and
    the string values of credential-like dict keys."""
    if isinstance(obj, str):
        return assigned_secrets(obj)
    found: set[str] = set()
    if isinstance(obj, Mapping):
        for key, value in obj.items():
            if (
                isinstance(key, str)
                and isinstance(value, str)
                and is_secret_name(key)
                and not _PLACEHOLDER.fullmatch(value)
            ):
                found.add(value)
            found |= secrets_in(value)
    elif isinstance(obj, (list, tuple, set, frozenset)):
        for item in obj:
            found |= secrets_in(item)
    return found


class Redactor:
    """Replaces a fixed set of secret values wherever they appear."""

    def __init__(self, values: Iterable[str]) -> None:
        values = set(values)
        # Longest first, so that a secret containing another is replaced whole.
        ordered = sorted({v for v in values if _long_enough(v)}, key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, ordered))) if ordered else None
        # Short ones only where they are assigned (elsewhere they could be any word).
        self._short = {v for v in values if MIN_ASSIGNED_LEN <= len(v) < MIN_SECRET_LEN}

    def text(self, text: str) -> str:
        if self._pattern is not None:
            text = self._pattern.sub(REDACTED, text)
        if self._short:
            text = self._assigned_short(text)
        return text

    def _assigned_short(self, text: str) -> str:
        spans = sorted(
            {
                match.span("value")
                for match, strict in _assignments(text)
                if strict and match["value"] in self._short
            }
        )
        out, pos = [], 0
        for start, end in spans:
            if start >= pos:
                out += [text[pos:start], REDACTED]
                pos = end
        return "".join([*out, text[pos:]])

    def data(self, obj: T) -> T:
        """A copy of dicts/lists/tuples with every string redacted (keys included)."""
        if isinstance(obj, str):
            return self.text(obj)  # type: ignore[return-value]
        if isinstance(obj, Mapping):
            return {  # type: ignore[return-value]
                (self.text(k) if isinstance(k, str) else k): self.data(v) for k, v in obj.items()
            }
        if isinstance(obj, list):
            return [self.data(v) for v in obj]  # type: ignore[return-value]
        if isinstance(obj, tuple):
            return tuple(self.data(v) for v in obj)  # type: ignore[return-value]
        return obj


def redactor_for(obj: Any = None, env: Mapping[str, str] | None = None) -> Redactor:
    """A Redactor for the environment's secrets and those assigned inside `obj` (text or data)."""
    return Redactor(environment_secrets(env) | secrets_in(obj))


def redact(obj: T, env: Mapping[str, str] | None = None) -> T:
    """`obj` (a string, or dicts/lists of them) with every secret replaced by REDACTED."""
    return redactor_for(obj, env).data(obj)


def changed_keys(before: Any, after: Any, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two nested dicts (what redaction changed)."""
    if isinstance(before, Mapping) and isinstance(after, Mapping):
        keys: list[str] = []
        for key in before:
            keys += changed_keys(before[key], after.get(key), f"{prefix}{key}.")
        return keys
    return [] if _same(before, after) else [prefix.rstrip(".")]


def _same(before: Any, after: Any) -> bool:
    """Equal, counting NaN as equal to NaN (optim.grad_clip=nan holds no credential)."""
    if isinstance(before, float) and isinstance(after, float):
        return before == after or (math.isnan(before) and math.isnan(after))
    if isinstance(before, (list, tuple)) and isinstance(after, (list, tuple)):
        return len(before) == len(after) and all(map(_same, before, after))
    return bool(before is after or before == after)


def redact_file(path: Path, redactor: Redactor | None = None) -> bool:
    """Rewrite a text file without its secrets (replaced whole, its permission bits kept); True
    when something was removed. A symbolic link is left alone: never written through.

    Without a redactor: the environment's secrets and those assigned inside the file.
    """
    if path.is_symlink():
        return False
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    clean = (redactor_for(text) if redactor is None else redactor).text(text)
    if clean == text:
        return False
    replace_own(path, clean)
    return True


def redact_tree(directory: Path, redactor: Redactor | None = None) -> list[Path]:
    """redact_file on every file under `directory` (if it exists); the files that changed. Links
    are not followed: not the directory itself, nor a file or directory under it."""
    if directory.is_symlink() or not directory.is_dir():
        return []
    return [p for p in sorted(directory.rglob("*")) if p.is_file() and redact_file(p, redactor)]
