"""The OpenAI server's app on a tiny real engine, in-process, for the unit tests of the HTTP layer
(no socket, no trained run): a 1-layer GPT over bytes, and a transformers tokenizer whose chat
template is Mistral's/Llama-2's rule (roles alternate user/assistant, else raise_exception)."""

from __future__ import annotations

from pathlib import Path

import torch

from launcher.config.model import ModelConfig
from launcher.config.serve import ServeConfig
from launcher.models.gpt import GPT
from launcher.serve.adapters import Adapter, GPTAdapter, vocab_of
from launcher.serve.codec import Codec, chat_tokenizer
from launcher.serve.engine import Engine
from launcher.serve.server import ServeState
from launcher.serve.worker import EngineThread
from tests.data_sources import train_tokenizer

ALTERNATE = "Conversation roles must alternate user/assistant/user/assistant/..."
STRICT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('" + ALTERNATE + "') }}{% endif %}"
    "{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
PROMPT_LIMIT = 48


def tiny_model() -> GPT:
    torch.manual_seed(0)
    return GPT(ModelConfig(n_layer=1, n_head=2, d_model=32, seq_len=64)).eval()


def strict_chat(directory: Path) -> object:
    """A transformers tokenizer with the strict template (its text is encoded as bytes)."""
    import json

    train_tokenizer(directory)
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": STRICT_TEMPLATE}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    chat = chat_tokenizer(str(directory))
    assert chat is not None
    return chat


def tiny_state(
    slots: int,
    queue: int,
    *,
    adapter: Adapter | None = None,
    chat: object | None = None,
    **serve: object,
) -> ServeState:
    """An app's state on a tiny GPT (the engine thread not started)."""
    model = tiny_model()
    codec = Codec(None, None, chat)
    adapter = adapter or GPTAdapter(model, slots)
    engine = Engine(adapter, slots, decode=codec.decode, queue=queue)
    config = ServeConfig(slots=slots, queue=queue, max_new_tokens=8, **serve)  # type: ignore[arg-type]
    return ServeState(
        EngineThread(engine), codec, config, PROMPT_LIMIT, "test", vocab=vocab_of(model)
    )
