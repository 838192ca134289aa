"""`launch serve` through the official `openai` client (issue 23): completions plain and
streamed, lists of prompts, n, logprobs and echo whose numbers are the model's own, the request
lm-evaluation-harness's local-completions sends to score loglikelihood, /v1/models, chat on a
tokenizer with a chat template, every unsupported parameter refused, bad bodies answered 4xx in
OpenAI's shape, and a client that goes away has its requests cancelled."""

from __future__ import annotations

import contextlib
import json
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.e2e.serve_run import shared_run, start_serve
from tests.installed import require

require("fastapi", "openai")

httpx = pytest.importorskip("httpx")
pytestmark = pytest.mark.e2e

PROMPT = "the cat sat"


@pytest.fixture(scope="session")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shared_run(tmp_path_factory)


@pytest.fixture(scope="module")
def served(run: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Any, Path]]:
    log = tmp_path_factory.mktemp("openai") / "serve.log"
    base, proc = start_serve(run, log, "serve.slots=1", "serve.queue=64")
    yield base, proc, log
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, log.read_text()
    assert "Traceback" not in log.read_text()


@pytest.fixture(scope="module")
def server(served: tuple[str, Any, Path]) -> str:
    return served[0]


@pytest.fixture(scope="module")
def client(server: str) -> Any:
    import openai

    return openai.OpenAI(base_url=f"{server}/v1", api_key="none", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def model(run: Path) -> Any:
    from launcher.serve.load import load_run

    return load_run(str(run), torch.device("cpu"))


def _logprobs_of(model: Any, ids: list[int]) -> torch.Tensor:
    """log p(token i | tokens before it) for i >= 1, computed here from the loaded model."""
    from launcher.models.output import logits_of

    with torch.no_grad():
        logits = logits_of(model.model(torch.tensor([ids])))
    assert logits is not None
    rows = torch.log_softmax(logits[0].float(), dim=-1)
    return rows[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]


def test_models_names_and_plain_completions(client: Any, run: Path) -> None:
    import openai

    assert [m.id for m in client.models.list().data] == [run.name]  # never a path
    with pytest.raises(openai.NotFoundError) as wrong:
        client.completions.create(model="gpt-4", prompt=PROMPT)
    assert wrong.value.body["param"] == "model" and wrong.value.body["code"] == "model_not_found"

    one = client.completions.create(model=run.name, prompt=PROMPT, max_tokens=5)
    assert one.model == run.name and len(one.choices) == 1
    assert one.usage.completion_tokens <= 5 and one.usage.prompt_tokens > 0

    prompts = [PROMPT, "a dog ran"]
    many = client.completions.create(
        model=run.name, prompt=prompts, max_tokens=4, n=2, temperature=0.8, seed=3
    )
    assert [c.index for c in many.choices] == [0, 1, 2, 3]
    alone = client.completions.create(
        model=run.name, prompt="a dog ran", max_tokens=4, temperature=0.8, seed=3
    )
    assert many.choices[2].text == alone.choices[0].text  # prompt-major, choice 0 with the seed
    assert many.usage.prompt_tokens == one.usage.prompt_tokens + alone.usage.prompt_tokens

    streamed = client.completions.create(
        model=run.name,
        prompt=PROMPT,
        max_tokens=5,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(streamed)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == one.choices[0].text
    assert chunks[-1].usage.total_tokens == one.usage.total_tokens
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_logprobs_and_echo_are_the_models_own(client: Any, run: Path, model: Any) -> None:
    ids = model.codec.encode(PROMPT)
    echo = client.completions.create(
        model=run.name, prompt=PROMPT, max_tokens=0, echo=True, logprobs=2
    )
    lp = echo.choices[0].logprobs
    assert echo.choices[0].text == model.codec.decode(ids) and lp.token_logprobs[0] is None
    assert len(lp.tokens) == len(ids) and echo.usage.completion_tokens == 0
    expected = _logprobs_of(model, ids)
    assert torch.allclose(torch.tensor(lp.token_logprobs[1:]), expected, atol=1e-5)

    gen = client.completions.create(model=run.name, prompt=PROMPT, max_tokens=3, logprobs=2)
    scores = gen.choices[0].logprobs
    assert len(scores.tokens) == gen.usage.completion_tokens
    for chosen, top in zip(scores.token_logprobs, scores.top_logprobs, strict=True):
        assert chosen == pytest.approx(max(top.values()), abs=1e-6)  # greedy: the best token


def test_lm_eval_loglikelihood_request(server: str, run: Path, model: Any) -> None:
    """local-completions' _create_payload(generate=False) and parse_logprobs, as it sends and
    reads them: token-id prompts, echo, max_tokens=1, logprobs=1; sum token_logprobs[ctxlen:-1]."""
    context, continuation = model.codec.encode("the cat"), model.codec.encode(" sat on a mat")
    body = {
        "model": run.name,
        "prompt": [context + continuation, continuation],
        "temperature": 0,
        "max_tokens": 1,
        "logprobs": 1,
        "seed": 1234,
        "echo": True,
    }
    reply = httpx.post(f"{server}/v1/completions", json=body, timeout=60).json()
    choice = sorted(reply["choices"], key=lambda c: c["index"])[0]
    ctxlen = len(context)
    got = sum(choice["logprobs"]["token_logprobs"][ctxlen:-1])
    expected = float(_logprobs_of(model, context + continuation)[ctxlen - 1 :].sum())
    assert got == pytest.approx(expected, abs=1e-4)
    tops = choice["logprobs"]["top_logprobs"][ctxlen:-1]
    assert all(isinstance(t, dict) and len(t) >= 1 for t in tops)


def test_chat_completions(client: Any, run: Path) -> None:
    messages = [{"role": "user", "content": "the cat"}]
    reply = client.chat.completions.create(model=run.name, messages=messages, max_tokens=4)
    assert reply.object == "chat.completion" and reply.choices[0].message.role == "assistant"
    stream = client.chat.completions.create(
        model=run.name, messages=messages, max_tokens=4, stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == reply.choices[0].message.content


REFUSED: list[tuple[str, dict[str, Any]]] = [
    ("suffix", {"suffix": "x"}),
    ("best_of", {"best_of": 3}),
    ("logit_bias", {"logit_bias": {"5": 10}}),
    ("presence_penalty", {"presence_penalty": 0.5}),
    ("frequency_penalty", {"frequency_penalty": 0.5}),
    ("mystery", {"extra_body": {"mystery": 1}}),
    ("stop", {"stop": ["a", "b", "c", "d", "e"]}),
]


def test_every_unsupported_parameter_is_refused(client: Any, run: Path) -> None:
    import openai

    for param, extra in REFUSED:
        with pytest.raises(openai.BadRequestError) as refused:
            client.completions.create(model=run.name, prompt=PROMPT, **extra)
        assert refused.value.body["param"] == param, param
    messages = [{"role": "user", "content": "hi"}]
    chat_refused: list[tuple[str, dict[str, Any]]] = [("logprobs", {"logprobs": True})]
    chat_refused.append(("tools", {"tools": []}))
    for param, extra in chat_refused:
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(model=run.name, messages=messages, **extra)
        assert refused.value.body["param"] == param, param


def test_bad_bodies_get_4xx_in_openais_shape(server: str) -> None:
    url = f"{server}/v1/completions"
    headers = {"content-type": "application/json"}
    deep = b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    cases = {
        "surrogate": (httpx.post(url, content=b'{"prompt": "ab\\ud800|"}', headers=headers), 400),
        "deep": (httpx.post(url, content=deep, headers=headers), 400),
        "huge": (httpx.post(url, content=b" " * (2 << 20), headers=headers), 413),
        "missing": (httpx.get(f"{server}/v2/nothing"), 404),
        "method": (httpx.get(url), 405),
    }
    for name, (reply, status) in cases.items():
        assert reply.status_code == status, (name, reply.text)
        assert set(reply.json()["error"]) == {"message", "type", "param", "code"}, name
    assert httpx.get(f"{server}/health").status_code == 200


def test_a_client_that_goes_away_is_not_computed_for(server: str, run: Path) -> None:
    """One slot, twelve requests abandoned at once: the queue is dropped, not worked through."""
    body = json.dumps({"model": run.name, "prompt": PROMPT, "max_tokens": 28}).encode()

    def abandon(_: int) -> None:
        # The first request can be answered inside the 50 ms (a tiny model); the rest wait.
        with contextlib.suppress(httpx.TimeoutException):
            httpx.post(f"{server}/v1/completions", content=body, timeout=0.05)

    before = httpx.get(f"{server}/health").json()["cancelled"]
    with ThreadPoolExecutor(12) as pool:
        list(pool.map(abandon, range(12)))
    deadline = time.monotonic() + 60
    while (health := httpx.get(f"{server}/health").json())["active"] + health["waiting"]:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert health["cancelled"] - before >= 6, health


def test_clients_gone_mid_body_or_mid_answer_leave_no_traceback(
    served: tuple[str, Any, Path], run: Path
) -> None:
    """A client that closes while sending its body logged a ClientDisconnect traceback, and each
    abandoned request an asyncio "exception was never retrieved"; the server's log stays clean."""
    import socket

    base, _, log = served
    port = int(base.rsplit(":", 1)[1])
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                b'\r\nContent-Length: 100\r\n\r\n{"prompt": "the'
            )
            time.sleep(0.2)  # the handler is reading the body
    body = json.dumps({"model": run.name, "prompt": PROMPT, "max_tokens": 28}).encode()

    def abandon(_: int) -> None:
        with contextlib.suppress(httpx.TimeoutException):
            httpx.post(f"{base}/v1/completions", content=body, timeout=0.05)

    with ThreadPoolExecutor(12) as pool:  # one slot: most of them wait, and are abandoned
        list(pool.map(abandon, range(12)))
    deadline = time.monotonic() + 60
    while (health := httpx.get(f"{base}/health").json())["active"] + health["waiting"]:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert httpx.post(f"{base}/v1/completions", content=body, timeout=60).status_code == 200
    text = log.read_text()
    assert "Traceback" not in text and "never retrieved" not in text, text


def test_port_in_use_is_named_before_the_model_loads(
    run: Path, server: str, capfd: pytest.CaptureFixture[str]
) -> None:
    from launcher.serve.command import serve_main

    port = server.rsplit(":", 1)[1]
    assert serve_main([str(run), f"serve.port={port}"]) == 2
    err = capfd.readouterr().err
    assert "serve.port" in err and "serving" not in err, err


def test_sigterm_drains_answering_503_and_every_request_held(
    served: tuple[str, Any, Path], run: Path
) -> None:
    """Last in this module: it stops the server. One slot, sixteen requests sent at once: after
    SIGTERM /health and new requests get 503 (the port stays open), every request the server held
    at SIGTERM is answered 200, and one that arrives after it gets 503 with Retry-After."""
    base, proc, log = served
    body = {"model": run.name, "prompt": PROMPT, "max_tokens": 28}
    with ThreadPoolExecutor(16) as pool:
        sent = [
            pool.submit(httpx.post, f"{base}/v1/completions", json=body, timeout=120)
            for _ in range(16)
        ]
        # Wait until one request decodes and another waits behind it; the first ones may finish
        # before the last arrive, so the count held at SIGTERM is read, not assumed.
        # (Those answered are counted before /health is read, so none is counted twice.)
        deadline = time.monotonic() + 60
        while True:
            answered_before = sum(f.done() for f in sent)
            if (now := httpx.get(f"{base}/health").json())["waiting"] >= 1:
                break
            assert time.monotonic() < deadline, "no request ever waited for the one slot"
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 60
        while (health := httpx.get(f"{base}/health")).status_code == 200:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert health.status_code == 503 and health.json()["error"]["code"] == "server_busy"
        late = httpx.post(f"{base}/v1/completions", json=body, timeout=60)
        assert late.status_code == 503 and late.headers["retry-after"] == "1"
        statuses = [f.result(timeout=120).status_code for f in sent]
    held = now["active"] + now["waiting"]
    assert set(statuses) <= {200, 503}, statuses
    assert statuses.count(200) >= answered_before + held, (statuses, answered_before, now)
    refused = [f.result() for f in sent if f.result().status_code == 503]
    assert all(r.headers["retry-after"] == "1" for r in refused)
    assert proc.wait(timeout=60) == 0, log.read_text()
    assert "every request held was answered" in log.read_text()
