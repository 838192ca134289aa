"""A local tokenizer directory: tokenizers' tokenizer.json, else anything AutoTokenizer loads.

Imported only for data=hf; the libraries are the `hf` extra.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.errors import DataError
from launcher.tokenizing.worker import encode

INSTALL = "pip install 'launcher[hf]'"
EOS_CANDIDATES = ("</s>", "<|endoftext|>", "<eos>", "<|end_of_text|>", "[SEP]")
IDENTITY_FILES = ("tokenizer", "vocab", "merges", "special_tokens", "added_tokens", "spiece")


def require(module: str) -> Any:
    """Import an optional library of the hf extra, or say how to install it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise DataError(
            f"data=hf needs the {module!r} library, which is not installed. "
            f"Fix: {INSTALL} (transformers, tokenizers, datasets)."
        ) from None


def _not_a_tokenizer(path: Path, why: str) -> DataError:
    return DataError(
        f"data.tokenizer: {path} is not a tokenizer directory ({why}). Fix: point "
        "data.tokenizer at a directory holding tokenizer.json (tokenizers' Tokenizer.save) or "
        "saved by transformers' tokenizer.save_pretrained."
    )


@dataclass
class LocalTokenizer:
    path: Path
    backend: Any
    fast: bool
    """True: a tokenizers.Tokenizer; False: a transformers tokenizer."""
    eos_id: int
    vocab_size: int

    def encode(self, texts: list[str]) -> list[list[int]]:
        return encode(self.backend, self.fast, texts)

    def identity(self) -> str:
        """A hash of the files that define the tokenizer (not of weights beside it)."""
        h = hashlib.sha256()
        for f in sorted(self.path.iterdir()):
            if f.is_file() and (f.name.startswith(IDENTITY_FILES) or f.suffix == ".model"):
                h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
        return h.hexdigest()


def _configured_eos(path: Path) -> str | None:
    config = path / "tokenizer_config.json"
    if not config.is_file():
        return None
    try:
        eos = json.loads(config.read_text(encoding="utf-8")).get("eos_token")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        return None
    if isinstance(eos, dict):
        eos = eos.get("content")
    return eos if isinstance(eos, str) else None


def load_tokenizer(directory: str, eos_token: str | None) -> LocalTokenizer:
    path = Path(directory).expanduser()
    if not path.exists():
        raise _not_a_tokenizer(path, "it does not exist")
    if not path.is_dir():
        raise _not_a_tokenizer(path, "it is a file, not a directory")
    if (path / "tokenizer.json").is_file():
        tokenizers = require("tokenizers")
        try:
            backend = tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))
        except Exception as exc:
            raise _not_a_tokenizer(path, f"tokenizer.json does not load: {exc}") from None
        fast, vocab = True, backend.get_vocab_size(with_added_tokens=True)
        to_id = backend.token_to_id
    else:
        transformers = require("transformers")
        try:
            backend = transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        except Exception as exc:
            why = f"no tokenizer.json, and AutoTokenizer cannot load it: {type(exc).__name__}"
            raise _not_a_tokenizer(path, why) from None
        fast, vocab = False, len(backend)
        to_id = backend.convert_tokens_to_ids
    wanted = [eos_token] if eos_token else [_configured_eos(path), *EOS_CANDIDATES]
    for name in wanted:
        if name is not None:
            eos_id = to_id(name)
            if isinstance(eos_id, int) and eos_id >= 0 and (fast or eos_id != backend.unk_token_id):
                return LocalTokenizer(path, backend, fast, eos_id, vocab)
    key = "data.eos_token" if eos_token else "data.tokenizer"
    raise DataError(
        f"{key}: the tokenizer {path} has no end-of-sequence token (tried "
        f"{', '.join(n for n in wanted if n)}). Fix: set data.eos_token to a token in its "
        "vocabulary."
    )
