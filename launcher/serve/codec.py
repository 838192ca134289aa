"""Text <-> token ids for the run's data: the bytes of the built-in sources (reverse, text,
jsonl), or data=hf's tokenizer. A token-file or custom dataset has no text form to encode."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.config.data import DataConfig, DataKind
from launcher.data.reverse import END
from launcher.errors import ConfigError

BYTE_SOURCES = (DataKind.reverse, DataKind.text, DataKind.jsonl)


class ChatTemplateError(ValueError):
    """The chat template refused the messages (its raise_exception, or an error in it)."""


@dataclass
class Codec:
    backend: Any | None
    """None: bytes (UTF-8); else a tokenizers.Tokenizer or a transformers tokenizer."""
    eos_id: int | None
    """Generation ends at this token (not part of the completion); None: no such token."""
    chat: Any | None = None
    """A transformers tokenizer whose chat template renders chat messages; None: no template."""

    def encode(self, text: str) -> list[int]:
        if self.backend is None:
            return list(text.encode("utf-8"))
        encoded = self.backend.encode(text, add_special_tokens=False)
        return list(getattr(encoded, "ids", encoded))

    def decode(self, ids: list[int]) -> str:
        if self.backend is None:
            return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")
        return str(self.backend.decode(ids, skip_special_tokens=True))

    def token_text(self, token: int) -> str:
        """One token's own text (as the logprobs of the API list it)."""
        if self.backend is None:
            return bytes([token]).decode("utf-8", errors="replace") if token < 256 else ""
        return str(self.backend.decode([token], skip_special_tokens=False))

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        """The prompt text of chat messages, ready for the assistant's answer. ChatTemplateError
        when the template refuses them (Llama-2-style templates raise_exception unless user and
        assistant alternate) or fails on them (any exception while it renders: a 400 with its
        message, never a 500 with a traceback in the server's log)."""
        from jinja2 import TemplateError

        assert self.chat is not None
        try:
            text = self.chat.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True
            )
        except TemplateError as exc:
            raise ChatTemplateError(str(exc) or type(exc).__name__) from None
        except Exception as exc:  # a Python error inside the template (`'a' + 1`, `1 // 0`)
            raise ChatTemplateError(f"{type(exc).__name__}: {exc}") from None
        return str(text)


def chat_tokenizer(directory: str) -> Any | None:
    """The directory's tokenizer through transformers when it has a chat template."""
    path = Path(directory)
    config = path / "tokenizer_config.json"
    has = (path / "chat_template.jinja").is_file() or (
        config.is_file() and "chat_template" in json.loads(config.read_text(encoding="utf-8"))
    )
    if not has:
        return None
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path))
    return tokenizer if getattr(tokenizer, "chat_template", None) else None


def codec_for(data: DataConfig) -> Codec:
    """The run's tokenizer. The reversal task ends every answer with END ('.'): its EOS."""
    if data.name in BYTE_SOURCES:
        eos = ord(END) if data.name == DataKind.reverse else None
        return Codec(None, eos)
    if data.name == DataKind.hf:
        from launcher.data.tokenizer import load_tokenizer

        assert data.tokenizer is not None  # DataConfig checks this
        tokenizer = load_tokenizer(data.tokenizer, data.eos_token)
        return Codec(tokenizer.backend, tokenizer.eos_id, chat_tokenizer(data.tokenizer))
    raise ConfigError(
        "data",
        f"the run was trained on data={data.name.value}, which has no tokenizer to turn text "
        "prompts into tokens.",
        "generate from runs on reverse, text, jsonl or hf data (hf: its data.tokenizer).",
    )
