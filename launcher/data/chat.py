"""data=hf conversations (data.messages_field): each record's messages rendered with a chat
template, tokenized, and a target mask of the turns to train on (data.train_on).

Which characters are the assistant's, found on the rendered text and mapped to tokens through the
tokenizer's character offsets (so a token is a target when it starts inside an assistant span):

- a template with `{% generation %}` blocks: the blocks' spans, as transformers renders them
  (`render_jinja_template(..., return_assistant_tokens_mask=True)`);
- any other template, prefix differences: for assistant turn i, the conversation up to turn i
  rendered with the generation prompt is P, up to and including turn i is S; the span is S less
  P: the turn's text and the end-of-turn marker the template writes after it. This needs a
  template that renders a conversation incrementally (P a prefix of S, S a prefix of the whole);
  one that rewrites earlier turns is refused with the record's index and the way out.

data.train_on=all makes every token a target. The template's own text is the record: no EOS is
appended (the template's end-of-turn token ends each turn).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from launcher.config.data import DataConfig, TrainOn
from launcher.data.tokenizer import LocalTokenizer, require
from launcher.errors import DataError

GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")
Encoded = list[tuple[list[int], list[int]]]
"""Per record: (token ids, 1 where the token is a target)."""


def tokenizer_template(directory: Path) -> str | None:
    """The tokenizer directory's own chat template (chat_template.jinja, else
    tokenizer_config.json's default one); None: it has none."""
    jinja = directory / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    config = directory / "tokenizer_config.json"
    if not config.is_file():
        return None
    try:
        found = json.loads(config.read_text(encoding="utf-8")).get("chat_template")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        return None
    if isinstance(found, list):  # [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in found if isinstance(t, dict)}
        found = named.get("default")
    return found if isinstance(found, str) else None


def load_template(cfg: DataConfig, tokenizer_dir: Path) -> str:
    """The chat template: data.chat_template (its text, or a file), else the tokenizer's own."""
    given = cfg.chat_template
    if given is not None and ("{{" in given or "{%" in given):
        return given
    if given is not None:
        path = Path(given).expanduser()
        if not path.is_file():
            raise DataError(
                f"data.chat_template: {given!r} is neither a template (no '{{{{' or '{{%') nor a "
                "file. Fix: point data.chat_template at a .jinja file, or give the template's text."
            )
        return path.read_text(encoding="utf-8")
    found = tokenizer_template(tokenizer_dir)
    if found is None:
        raise DataError(
            f"data.chat_template: the tokenizer {tokenizer_dir} has no chat template (no "
            "chat_template in tokenizer_config.json, no chat_template.jinja). Fix: "
            "data.chat_template=FILE.jinja (or the template's text)."
        )
    return found


def chat_identity(cfg: DataConfig, tok: LocalTokenizer) -> dict[str, str]:
    """What the cache key adds for conversations: the template's text and what is trained on."""
    template = load_template(cfg, tok.path)
    return {
        "template": hashlib.sha256(template.encode()).hexdigest(),
        "train_on": cfg.train_on.value,
    }


def _special(tok: LocalTokenizer) -> dict[str, str]:
    """bos_token and eos_token as templates read them."""
    to_token = getattr(tok.backend, "id_to_token", None) or tok.backend.convert_ids_to_tokens
    eos = to_token(tok.eos_id) or ""
    bos = ""
    config = tok.path / "tokenizer_config.json"
    if config.is_file():
        try:
            value = json.loads(config.read_text(encoding="utf-8")).get("bos_token")
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
            value = None
        value = value.get("content") if isinstance(value, dict) else value
        bos = value if isinstance(value, str) else ""
    return {"bos_token": bos, "eos_token": eos}


class ConversationEncoder:
    """Called per batch of records: (batch, index of its first record) -> Encoded."""

    def __init__(self, tok: LocalTokenizer, cfg: DataConfig, path: Path) -> None:
        utils = require("transformers.utils.chat_template_utils")
        self.render_jinja: Callable[..., Any] = utils.render_jinja_template
        self.tok, self.cfg, self.path = tok, cfg, path
        self.template = load_template(cfg, tok.path)
        self.generation = bool(GENERATION.search(self.template))
        self.special = _special(tok)
        assert cfg.messages_field is not None  # DataConfig: a conversations run
        self.field = cfg.messages_field

    def render(self, messages: list[Any], prompt: bool = False, marks: bool = False) -> Any:
        rendered, indices = self.render_jinja(
            conversations=[messages],
            chat_template=self.template,
            add_generation_prompt=prompt,
            return_assistant_tokens_mask=marks,
            **self.special,
        )
        return (rendered[0], indices[0]) if marks else rendered[0]

    def spans(self, messages: list[Any], index: int) -> tuple[str, list[tuple[int, int]]]:
        """The rendered conversation and the character spans that are targets."""
        if self.cfg.train_on == TrainOn.all:
            text = self.render(messages)
            return text, [(0, len(text))]
        if self.generation:
            text, marks = self.render(messages, marks=True)
            return text, [(int(a), int(b)) for a, b in marks]
        text, found = self.render(messages), []
        for i, message in enumerate(messages):
            if message.get("role") != "assistant":
                continue
            before = self.render(messages[:i], prompt=True)
            upto = self.render(messages[: i + 1])
            if not (upto.startswith(before) and text.startswith(upto)):
                raise DataError(
                    f"data.chat_template: record {index} of {self.path}: the template does not "
                    f"render the conversation turn by turn (turn {i} changes the text before it), "
                    "so the assistant's tokens cannot be found by prefix. Fix: give a template "
                    "with {% generation %} ... {% endgeneration %} around each assistant turn "
                    "(data.chat_template), or train on every token with data.train_on=all."
                )
            found.append((len(before), len(upto)))
        return text, found

    def _checked(self, value: Any, index: int) -> list[Any]:
        ok = isinstance(value, list) and all(
            isinstance(m, Mapping) and isinstance(m.get("role"), str) for m in value
        )
        if not ok or not value:
            raise DataError(
                f"data.messages_field: record {index} of {self.path} has {self.field}="
                f"{str(value)[:120]}, not a non-empty list of {{'role', 'content'}} messages. "
                "Fix: clean the data, or point data.messages_field at the conversations' field."
            )
        return [dict(m) for m in value]

    def __call__(self, batch: dict[str, list[Any]], first: int) -> Encoded:
        texts, spans = [], []
        for i, value in enumerate(batch[self.field]):
            messages = self._checked(value, first + i)
            try:
                text, found = self.spans(messages, first + i)
            except DataError:
                raise
            except Exception as exc:
                message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                raise DataError(
                    f"data.chat_template: record {first + i} of {self.path}: the chat template "
                    f"failed ({type(exc).__name__}: {message}). Fix: correct that record, or "
                    "give a template that renders it (data.chat_template)."
                ) from None
            texts.append(text)
            spans.append(found)
        return [
            (ids, _targets(starts, found))
            for (ids, starts), found in zip(self._encode(texts), spans, strict=True)
        ]

    def _encode(self, texts: list[str]) -> list[tuple[list[int], np.ndarray]]:
        """Token ids and each token's first character."""
        backend = self.tok.backend
        if self.tok.fast:
            encodings = backend.encode_batch(texts, add_special_tokens=False)
            return [
                (e.ids, np.asarray([a for a, _ in e.offsets], dtype=np.int64)) for e in encodings
            ]
        try:
            out = backend(texts, add_special_tokens=False, return_offsets_mapping=True)
        except NotImplementedError:
            raise DataError(
                f"data.tokenizer: {self.tok.path} is a slow tokenizer without character offsets; "
                "conversations need them to find the assistant's tokens. Fix: save it as a fast "
                "tokenizer (tokenizer.json) with "
                "AutoTokenizer.from_pretrained(...).save_pretrained."
            ) from None
        return [
            (list(ids), np.asarray([a for a, _ in offsets], dtype=np.int64))
            for ids, offsets in zip(out["input_ids"], out["offset_mapping"], strict=True)
        ]


def _targets(starts: np.ndarray, spans: list[tuple[int, int]]) -> list[int]:
    trained = np.zeros(len(starts), dtype=bool)
    for a, b in spans:
        trained |= (starts >= a) & (starts < b)
    return trained.astype(np.uint8).tolist()
