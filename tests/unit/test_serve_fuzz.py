"""A fuzz test of the OpenAI endpoints (issue 33): hypothesis draws request bodies over the schema
of /v1/completions and /v1/chat/completions (each key with a plausible value, or an extreme
number, a huge or over-long integer literal, an odd type, unicode, a lone surrogate escape), and
bodies that are not objects or not JSON, and sends them to the real app on a tiny engine. No
answer may be a 500 (or a 503: requests are sent one at a time), none may fail inside the engine,
and /health is 200 after. Derandomized, without an example database, at a fixed budget: the same
examples in every run. (With the sampling fix reverted, it finds temperature 5e-324 at once.)"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("hypothesis")
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from launcher.serve.server import ServeState, create_app
from tests.serve_app import strict_chat, tiny_state

EXAMPLES = 250
"""Per endpoint; both together take about 20 s on the 2-core CI machine."""
ANSWERS = {200, 400, 404}


class Raw(str):
    """JSON text put into the body as it is: what json.dumps cannot write (an integer of more
    than 4,300 digits, an exponent out of float range, a lone surrogate escape)."""


def dump(value: Any) -> str:
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(k)}:{dump(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(dump(v) for v in value) + "]"
    return json.dumps(value)


# Integers of 300-400 digits (beyond float range) and of 4,300-5,000 (beyond what Python reads).
lengths = st.one_of(st.integers(300, 400), st.integers(4300, 5000))
huge_ints = st.builds(
    lambda sign, n, d: Raw(f"{sign}1{d * n}"),
    st.sampled_from(["", "-"]),
    lengths,
    st.text("0123456789", min_size=1, max_size=1),
)
odd_literals = st.sampled_from(
    ["1e-400", "-1e-400", "1e999", "-1e999", "NaN", "Infinity", "-0.0", "0.1" + "0" * 400 + "1"]
).map(Raw)
extremes = st.one_of(huge_ints, huge_ints, odd_literals, st.floats(), st.integers())
numbers = st.one_of(extremes, st.floats(0, 2), st.booleans())
texts = st.one_of(st.text(max_size=12), st.just(Raw('"ab\\ud800"')), st.just(""))
scalars = st.one_of(st.none(), numbers, texts)
anything = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)


EDGES = [0.0, 5e-324, 2.2250738585072014e-308, 1e-45, 1.1754943508222875e-38, 1e-9, 1.0, 2.0]
"""The smallest float64 (subnormal and normal) and float32 values: where a scaled logit overflows
or a float32 copy rounds to 0."""


def in_range(low: float, high: float) -> st.SearchStrategy[float]:
    """Any float of [low, high], often one at its ends or at a limit of float32/float64."""
    ends = [low, high, math.nextafter(low, high), math.nextafter(high, low)]
    edges = st.sampled_from([x for x in [*EDGES, *ends] if low <= x <= high])
    return st.one_of(st.floats(low, high), edges)


token_ids = st.lists(st.integers(0, 255), min_size=1, max_size=6)
short = st.text(min_size=1, max_size=10)
COMMON = {
    "model": st.just("test"),
    "max_tokens": st.integers(1, 8),
    "temperature": in_range(0, 2),
    "top_p": in_range(1e-9, 1),
    "top_k": st.integers(0, 300),
    "n": st.integers(1, 3),
    "stream": st.booleans(),
    "stop": st.one_of(short, st.lists(short, max_size=4)),
    "seed": st.integers(-(1 << 63), (1 << 63) - 129),
    "user": st.text(max_size=8),
}
COMPLETION = {
    **COMMON,
    "prompt": st.one_of(short, st.lists(short, min_size=1, max_size=2), token_ids),
    "logprobs": st.integers(0, 5),
    "echo": st.booleans(),
}
ROLES = ["user", "assistant"]
turns = st.integers(1, 3).map(lambda k: [ROLES[i % 2] for i in range(k)])  # as the template asks
roles = st.one_of(turns, turns, st.lists(st.sampled_from(["system", *ROLES]), min_size=1))
messages = roles.flatmap(
    lambda rs: st.tuples(*[st.builds(lambda c, r=r: {"role": r, "content": c}, short) for r in rs])
).map(list)
CHAT = {**COMMON, "messages": messages}
NUMERIC = {"max_tokens", "temperature", "top_p", "top_k", "n", "seed", "logprobs"}
ODD_KEYS = ["logit_bias", "best_of", "suffix", "presence_penalty", "tools", "stream_options"]


def bodies(schema: dict[str, st.SearchStrategy[Any]], first: str) -> st.SearchStrategy[bytes]:
    """Valid requests (the engine runs them), the same with one key's value replaced by anything
    (or an unknown key added), any JSON value, and bytes."""
    required = {first: schema[first]}
    optional = {k: v for k, v in schema.items() if k != first}
    valid = st.fixed_dictionaries(required, optional=optional)
    keys = st.one_of(st.sampled_from([*schema, *ODD_KEYS]), st.text(max_size=6))
    spoilt = st.builds(lambda b, k, v: {**b, k: v}, valid, keys, st.one_of(extremes, anything))
    numeric = [k for k, v in schema.items() if k in NUMERIC]
    extreme = st.builds(lambda b, k, v: {**b, k: v}, valid, st.sampled_from(numeric), extremes)
    text = st.one_of(valid, valid, spoilt, extreme, anything).map(lambda v: dump(v).encode())
    return st.one_of(text, text, text, text, st.binary(max_size=40))


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServeState, TestClient]]:
    chat = strict_chat(Path(tmp_path_factory.mktemp("fuzz-tok")))
    state = tiny_state(slots=2, queue=3, chat=chat)
    state.worker.start()
    with TestClient(create_app(state)) as client:
        yield state, client
    state.worker.stop(timeout=30)
    assert state.worker.error is None


def _check(state: ServeState, client: TestClient, path: str, body: bytes) -> None:
    headers = {"content-type": "application/json"}
    failed = state.worker.engine.failed
    reply = client.post(path, content=body, headers=headers)
    assert reply.status_code in ANSWERS, (body[:300], reply.status_code, reply.text[:300])
    if reply.status_code != 200:
        assert set(reply.json()["error"]) == {"message", "type", "param", "code"}
    elif "text/event-stream" in reply.headers["content-type"]:
        assert reply.text.endswith("data: [DONE]\n\n"), reply.text[-300:]
    assert state.worker.engine.failed == failed, (body[:300], reply.text[:300])


FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@FUZZ
@given(body=bodies(COMPLETION, "prompt"))
def test_completions_fuzz(served: tuple[ServeState, TestClient], body: bytes) -> None:
    _check(*served, "/v1/completions", body)


@FUZZ
@given(body=bodies(CHAT, "messages"))
def test_chat_completions_fuzz(served: tuple[ServeState, TestClient], body: bytes) -> None:
    _check(*served, "/v1/chat/completions", body)


def test_health_after_the_fuzz(served: tuple[ServeState, TestClient]) -> None:
    state, client = served
    health = client.get("/health")
    assert health.status_code == 200 and health.json()["failed"] == 0
    assert health.json()["active"] == health.json()["waiting"] == 0
    assert state.worker.is_alive() and state.worker.error is None
