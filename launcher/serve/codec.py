"""Text <-> token ids for the run's data: the bytes of the built-in sources (reverse, text,
jsonl), or data=hf's tokenizer. A token-file or custom dataset has no text form to encode."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from launcher.config.data import DataConfig, DataKind
from launcher.data.reverse import END
from launcher.errors import ConfigError

BYTE_SOURCES = (DataKind.reverse, DataKind.text, DataKind.jsonl)


@dataclass
class Codec:
    backend: Any | None
    """None: bytes (UTF-8); else a tokenizers.Tokenizer or a transformers tokenizer."""
    eos_id: int | None
    """Generation ends at this token (not part of the completion); None: no such token."""

    def encode(self, text: str) -> list[int]:
        if self.backend is None:
            return list(text.encode("utf-8"))
        encoded = self.backend.encode(text, add_special_tokens=False)
        return list(getattr(encoded, "ids", encoded))

    def decode(self, ids: list[int]) -> str:
        if self.backend is None:
            return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")
        return str(self.backend.decode(ids, skip_special_tokens=True))


def codec_for(data: DataConfig) -> Codec:
    """The run's tokenizer. The reversal task ends every answer with END ('.'): its EOS."""
    if data.name in BYTE_SOURCES:
        eos = ord(END) if data.name == DataKind.reverse else None
        return Codec(None, eos)
    if data.name == DataKind.hf:
        from launcher.data.tokenizer import load_tokenizer

        assert data.tokenizer is not None  # DataConfig checks this
        tokenizer = load_tokenizer(data.tokenizer, data.eos_token)
        return Codec(tokenizer.backend, tokenizer.eos_id)
    raise ConfigError(
        "data",
        f"the run was trained on data={data.name.value}, which has no tokenizer to turn text "
        "prompts into tokens.",
        "generate from runs on reverse, text, jsonl or hf data (hf: its data.tokenizer).",
    )
