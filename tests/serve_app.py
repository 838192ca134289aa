"""The OpenAI server's app on a tiny real engine, in-process, for the unit tests of the HTTP layer
(no socket, no trained run): a 1-layer GPT over bytes, and a transformers tokenizer whose chat
template is Mistral's/Llama-2's rule (roles alternate user/assistant, else raise_exception)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

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


@contextmanager
def real_server(state: ServeState) -> Iterator[tuple[Any, threading.Thread, int]]:
    """The app of `state` under the real uvicorn server (launch serve's DrainingServer with its
    timeouts) on a free port of 127.0.0.1, in a thread: (server, its thread, the port) once it
    has started; stopped, and the engine with it, afterwards."""
    from launcher.serve.lifecycle import DrainingServer, bind
    from launcher.serve.server import create_app
    from launcher.serve.timeouts import uvicorn_config

    server = DrainingServer(uvicorn_config(create_app(state), state.serve), state)
    sock = bind("127.0.0.1", 0)
    state.worker.start()
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not server.started:
            assert thread.is_alive()
            thread.join(0.02)
        yield server, thread, sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(30)
        state.worker.stop(timeout=30)
        sock.close()
