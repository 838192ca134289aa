"""The HTTP layer of `launch serve` on a real engine (in-process ASGI, no socket): the OpenAI
shape, 400s with a reason, and a full queue answering 503 with Retry-After, not a hang."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("fastapi")
import httpx

from launcher.config.model import ModelConfig
from launcher.config.serve import ServeConfig
from launcher.models.gpt import GPT
from launcher.serve.adapters import GPTAdapter
from launcher.serve.codec import Codec
from launcher.serve.engine import Engine
from launcher.serve.server import ServeState, create_app
from launcher.serve.worker import EngineThread


def _state(slots: int, queue: int) -> ServeState:
    torch.manual_seed(0)
    model = GPT(ModelConfig(n_layer=1, n_head=2, d_model=32, seq_len=32)).eval()
    engine = Engine(GPTAdapter(model, slots), slots, decode=Codec(None, None).decode, queue=queue)
    serve = ServeConfig(slots=slots, queue=queue, max_new_tokens=8)
    return ServeState(EngineThread(engine), Codec(None, None), serve, 16, "test")


async def _exchange(state: ServeState) -> dict[str, httpx.Response]:
    app = create_app(state)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        post = client.post
        got = {
            "bad_json": await post("/v1/completions", content=b'{"prompt": '),
            "not_object": await post("/v1/completions", json=["x"]),
            "long_prompt": await post("/v1/completions", json={"prompt": "x" * 17}),
            "max_tokens": await post("/v1/completions", json={"prompt": "ab", "max_tokens": 9}),
            "temperature": await post(
                "/v1/completions", json={"prompt": "ab", "temperature": "hot"}
            ),
            "suffix": await post("/v1/completions", json={"prompt": "ab", "suffix": "x"}),
        }
        # The engine thread is not started yet: one request fills the slot, one the queue,
        # the third finds it full.
        held = [
            asyncio.create_task(post("/v1/completions", json={"prompt": p, "max_tokens": 4}))
            for p in ("abc", "xyz")
        ]
        while state.worker.engine.pending() < 2:
            await asyncio.sleep(0.01)
        got["full"] = await post("/v1/completions", json={"prompt": "q"})
        state.worker.start()
        got["first"], got["second"] = await asyncio.gather(*held)
        got["health"] = await client.get("/health")
    state.worker.stop(timeout=30)
    return got


def test_completions_shape_limits_and_full_queue() -> None:
    got = asyncio.run(_exchange(_state(slots=1, queue=1)))
    for name in ("bad_json", "not_object", "long_prompt", "max_tokens", "temperature", "suffix"):
        assert got[name].status_code == 400, name
        assert got[name].json()["error"]["message"], name
    assert "17 tokens" in got["long_prompt"].json()["error"]["message"]
    assert "serve.max_new_tokens" in got["max_tokens"].json()["error"]["message"]
    assert got["full"].status_code == 503 and got["full"].headers["retry-after"] == "1"
    for name, prompt in (("first", "abc"), ("second", "xyz")):
        body = got[name].json()
        assert got[name].status_code == 200, body
        choice = body["choices"][0]
        assert choice["finish_reason"] == "length" and isinstance(choice["text"], str)
        assert body["usage"] == {
            "prompt_tokens": len(prompt),
            "completion_tokens": 4,
            "total_tokens": len(prompt) + 4,
        }
    health = got["health"].json()
    assert got["health"].status_code == 200 and health["status"] == "ok"
    assert json.dumps(health)


def test_serve_without_the_extra_names_the_install(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from launcher.serve.command import generate_main, serve_main

    assert generate_main(["--help"]) == 0 and "PROMPTS.jsonl" in capfd.readouterr().out
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # what an install without [serve] has
    assert serve_main([str(tmp_path)]) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install 'launcher[serve]'" in err[0]
