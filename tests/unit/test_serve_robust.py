"""One request never stops the server (issue 33): tiny temperatures sample the greedy token
instead of overflowing; numbers of any size, integer literals over Python's digit limit, a chat
template's raise_exception and requests that could never fit are 4xx; a request that fails inside
an engine step fails alone and the engine goes on; an engine that cannot go on says so on /health
and stops the server (launch serve then exits 1 for its supervisor)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("fastapi")
import httpx
from fastapi.testclient import TestClient

from launcher.serve.adapters import GPTAdapter
from launcher.serve.sampling import Sampling, choose
from launcher.serve.server import ServeState, create_app
from tests.serve_app import ALTERNATE, real_server, strict_chat, tiny_model, tiny_state

TINY = (1e-38, 1e-300, 5e-324)
HUGE = "1" + "0" * 399  # a 400-digit integer: math.isfinite raised OverflowError on it
OVER_LIMIT = "7" * 5000  # over Python's 4,300-digit limit: json.loads raised ValueError


@pytest.fixture(scope="module")
def chat(tmp_path_factory: pytest.TempPathFactory) -> object:
    return strict_chat(tmp_path_factory.mktemp("strict-tok"))


@contextmanager
def serving(state: ServeState) -> Iterator[TestClient]:
    state.worker.start()
    try:
        with TestClient(create_app(state)) as client:
            yield client
    finally:
        state.worker.stop(timeout=30)


def test_tiny_temperatures_sample_the_greedy_token() -> None:
    logits = torch.tensor([1.0, 3.0, 2.999, -2.0, 40.0, 39.0]) * 1e3
    for temperature in (*TINY, 1e-30, 1e-45):
        sampling = Sampling(temperature, top_k=3, seed=1)
        for top_p in (1.0, 0.5):
            rule = Sampling(temperature, top_p=top_p, seed=1)
            draws = {choose(logits, s, s.generator()) for s in (sampling, rule) for _ in range(20)}
            assert draws == {4}, (temperature, top_p)
    tie = torch.tensor([5.0, 5.0, 0.0])  # the greedy limit shares a tie evenly
    sampling = Sampling(5e-324, seed=3)
    generator = sampling.generator()
    assert {choose(tie, sampling, generator) for _ in range(64)} == {0, 1}


def _completion(client: TestClient, body: dict[str, Any]) -> httpx.Response:
    return client.post("/v1/completions", json={"prompt": "abc|", "max_tokens": 4, **body})


def _raw(client: TestClient, text: str) -> httpx.Response:
    headers = {"content-type": "application/json"}
    return client.post("/v1/completions", content=text.encode(), headers=headers)


def test_extreme_inputs_then_a_normal_request(chat: object) -> None:
    state = tiny_state(slots=2, queue=2, chat=chat)
    with serving(state) as client:
        greedy = _completion(client, {"temperature": 0}).json()["choices"][0]["text"]
        for temperature in TINY:
            reply = _completion(client, {"temperature": temperature, "n": 2})
            assert reply.status_code == 200, reply.text
            assert [c["text"] for c in reply.json()["choices"]] == [greedy, greedy]
        streamed = _completion(client, {"temperature": 1e-38, "stream": True})
        assert streamed.status_code == 200 and "data: [DONE]" in streamed.text
        assert "error" not in streamed.text
        refused = {
            "temperature": _raw(client, f'{{"prompt": "ab", "temperature": {HUGE}}}'),
            "top_p": _raw(client, f'{{"prompt": "ab", "top_p": -{HUGE}}}'),
            "inf": _raw(client, '{"prompt": "ab", "temperature": 1e999}'),
            "seed": _raw(client, f'{{"prompt": "ab", "seed": {OVER_LIMIT}}}'),
            "nested": _raw(client, f'{{"prompt": [[1, {OVER_LIMIT}]]}}'),
            "n": _completion(client, {"n": 5}),  # 5 sequences; slots 2 + queue 2 hold 4
            "prompts": _completion(client, {"prompt": ["a"] * 10_000}),
            "template": client.post(
                "/v1/chat/completions",
                json={"messages": [{"role": "user", "content": "a"}] * 2, "max_tokens": 2},
            ),
        }
        for name, reply in refused.items():
            assert reply.status_code == 400, (name, reply.text)
            assert set(reply.json()["error"]) == {"message", "type", "param", "code"}, name
        messages = {name: reply.json()["error"]["message"] for name, reply in refused.items()}
        assert "400 digits" in messages["temperature"] and len(messages["temperature"]) < 200
        assert "more than 4300 digits" in messages["seed"] == messages["nested"]
        assert refused["n"].json()["error"]["param"] == "n"
        for name in ("n", "prompts"):
            assert "serve.slots=2 + serve.queue=2" in messages[name], messages[name]
            assert refused[name].json()["error"]["code"] == "too_many_sequences"
        assert ALTERNATE in messages["template"]
        assert refused["template"].json()["error"]["param"] == "messages"
        assert _raw(client, '{"prompt": "ab", "temperature": 1e-400}').status_code == 200  # 0.0
        chat_reply = client.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "a"}], "temperature": 5e-324},
        )
        assert chat_reply.status_code == 200, chat_reply.text
        assert _completion(client, {"temperature": 0.7, "seed": 3}).status_code == 200
        health = client.get("/health")
    assert health.status_code == 200 and health.json()["failed"] == 0
    assert state.worker.error is None


class PoisonedGPT(GPTAdapter):
    """The tiny GPT, failing on marked prompts: first token 7 in its prefill, 8 in the decode step
    after its prefill (together with every request decoded in that step); `broken` fails every
    prefill (a device that cannot go on)."""

    def __init__(self, slots: int) -> None:
        super().__init__(tiny_model(), slots)
        self.decode_poison: set[int] = set()
        self.broken = False

    def prefill(self, slot: int, ids: list[int], every: bool = False) -> torch.Tensor:
        if self.broken or ids[0] == 7:
            raise RuntimeError("poisoned prefill")
        if ids[0] == 8:
            self.decode_poison.add(slot)
        return super().prefill(slot, ids, every)

    def decode(self, slots: list[int], tokens: list[int], positions: list[int]) -> torch.Tensor:
        if self.decode_poison & set(slots):
            self.decode_poison -= set(slots)
            raise RuntimeError("poisoned decode")
        return super().decode(slots, tokens, positions)


def test_a_failing_step_fails_only_its_requests() -> None:
    adapter = PoisonedGPT(slots=2)
    state = tiny_state(slots=2, queue=4, adapter=adapter)
    with serving(state) as client:
        for prompt, why in (([7, 97], "poisoned prefill"), ([8, 97], "poisoned decode")):
            reply = _completion(client, {"prompt": [prompt]})
            assert reply.status_code == 500, reply.text
            failure = reply.json()["error"]
            assert failure["type"] == "server_error" and failure["code"] == "generation_failed"
            assert f"RuntimeError: {why}" in failure["message"]
        # A list whose first prompt fails at its prefill: the second is still generated.
        mixed = _completion(client, {"prompt": [[7, 97], [97, 98]]})
        assert mixed.status_code == 500
        streamed = _completion(client, {"prompt": [[7, 97]], "stream": True})
        assert streamed.status_code == 200
        assert "generation failed: RuntimeError: poisoned prefill" in streamed.text
        after = _completion(client, {"prompt": "abc|"})
        assert after.status_code == 200, after.text
        health = client.get("/health")
    engine = state.worker.engine
    assert health.status_code == 200 and health.json()["failed"] == 4
    assert state.worker.error is None and engine.failed == 4
    assert engine.tokens_generated >= 4 + 4  # the mixed list's good prompt, and `after`


def test_an_engine_that_cannot_go_on_says_so() -> None:
    adapter = PoisonedGPT(slots=1)
    state = tiny_state(slots=1, queue=1, adapter=adapter)
    adapter.broken = True
    with serving(state) as client:
        failed = _completion(client, {})
        assert failed.status_code == 500 and "poisoned prefill" in failed.text
        health, later = client.get("/health"), _completion(client, {})
    for reply in (health, later):
        assert reply.status_code == 503, reply.text
        error = reply.json()["error"]
        assert error["code"] == "engine_failed" and "shutting down" not in error["message"]
        assert "EngineBroken" in error["message"] and "supervisor" in error["message"]


def test_a_broken_engine_stops_the_server() -> None:
    """The real uvicorn server: the engine's failure ends server.run (launch serve then exits
    1, launcher/serve/command.py), with no signal."""
    adapter = PoisonedGPT(slots=1)
    state = tiny_state(slots=1, queue=1, adapter=adapter)
    with real_server(state) as (server, thread, port):
        base = f"http://127.0.0.1:{port}"
        assert httpx.get(f"{base}/health").status_code == 200
        adapter.broken = True
        reply = httpx.post(f"{base}/v1/completions", json={"prompt": "ab"}, timeout=60)
        assert reply.status_code == 500
        thread.join(60)
        assert not thread.is_alive() and server.should_exit and not server.draining
        assert type(state.worker.error).__name__ == "EngineBroken"


def test_a_failed_prompt_of_generate_is_written_with_its_error(tmp_path: Path) -> None:
    import io

    from launcher.serve.codec import Codec
    from launcher.serve.engine import Engine, Request
    from launcher.serve.generate import GenerationFailed, check_failures, generate
    from launcher.serve.prompts import parse_line

    engine = Engine(PoisonedGPT(slots=2), 2, decode=Codec(None, None).decode)
    texts = ['{"prompt": "ab"}', '{"prompt": "\\u0007"}']
    lines = [parse_line(n, text, "p.jsonl") for n, text in enumerate(texts, start=1)]
    requests = [Request(list(x.prompt.encode()), 3, tag=x) for x in lines]
    out = io.StringIO()
    generate(engine, requests, out, io.StringIO())
    written = out.getvalue().splitlines()
    assert len(written) == 2 and '"error": "RuntimeError: poisoned prefill"' in written[1]
    with pytest.raises(GenerationFailed) as failed:
        check_failures(requests)
    assert "1 of 2 prompts failed" in str(failed.value) and "line 2" in str(failed.value)
    assert failed.value.exit_code == 1


def test_generate_lines_with_numbers_of_any_size_are_one_error() -> None:
    from launcher.config.serve import ServeConfig
    from launcher.errors import ConfigError
    from launcher.serve.prompts import parse_line

    for line, words in [
        (f'{{"prompt": "a", "seed": {OVER_LIMIT}}}', "more than 4300 digits"),
        (f'{{"prompt": "a", "max_new_tokens": 2, "seed": {HUGE}}}', '"seed" must be in'),
    ]:
        with pytest.raises(ConfigError) as refused:
            parse_line(1, line, "p.jsonl")
        assert words in str(refused.value) and "p.jsonl line 1" in str(refused.value)
    assert parse_line(1, '{"prompt": "a", "seed": -9223372036854775808}', "p").seed == -(1 << 63)
    with pytest.raises(ConfigError, match=r"serve\.seed"):
        ServeConfig(seed=1 << 63)


def test_a_template_that_fails_on_the_messages_is_a_400(chat: object) -> None:
    """A Python error inside the template (not jinja's own TemplateError) was a 500 with a
    traceback in the server's log; it is the template refusing these messages: a 400."""
    import copy

    failing = copy.deepcopy(chat)
    failing.chat_template = (  # type: ignore[attr-defined]
        "{% for m in messages %}{% if m['content'] == 'add' %}{{ m['content'] + 1 }}"
        "{% elif m['content'] == 'div' %}{{ 1 // 0 }}{% else %}{{ m['content'] }}{% endif %}"
        "{% endfor %}"
    )
    state = tiny_state(slots=2, queue=2, chat=failing)
    with serving(state) as client:
        for content, why in (("add", "TypeError"), ("div", "ZeroDivisionError")):
            reply = client.post(
                "/v1/chat/completions",
                json={"messages": [{"role": "user", "content": content}], "max_tokens": 2},
            )
            assert reply.status_code == 400, reply.text
            error = reply.json()["error"]
            assert (error["param"], error["code"]) == ("messages", "chat_template")
            assert why in error["message"]
        fine = {"messages": [{"role": "user", "content": "ab"}], "max_tokens": 2}
        assert client.post("/v1/chat/completions", json=fine).status_code == 200
        assert client.get("/health").status_code == 200


def test_an_empty_stop_string_of_generate_is_one_error() -> None:
    """`"stop": ""` matched at once: every completion came back empty without a word (the API
    refuses it; so does generate now, as it refused `"stop": [""]`)."""
    from launcher.errors import ConfigError
    from launcher.serve.prompts import parse_line

    for stop in ('""', '[""]', '["a", ""]'):
        with pytest.raises(ConfigError, match='"stop" must be a string or a list of non-empty'):
            parse_line(3, f'{{"prompt": "a", "stop": {stop}}}', "p.jsonl")
    assert parse_line(3, '{"prompt": "a", "stop": "."}', "p").stop == (".",)
