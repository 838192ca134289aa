"""The end-of-sequence token that ends a completion is a generated token, as OpenAI-style servers
report it: with `logprobs`, listed last with the text "" and its log-probability; counted in
usage.completion_tokens; never in the text. lm-evaluation-harness' local-completions sends
echo + logprobs + max_tokens=1 and reads token_logprobs[ctxlen:-1], so without it the last
continuation token's score is lost whenever the model's next token is EOS (issue 36)."""

from __future__ import annotations

import asyncio
from typing import Any

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

PROMPT = "the cat"


def _model() -> GPT:
    torch.manual_seed(0)
    return GPT(ModelConfig(n_layer=1, n_head=2, d_model=32, seq_len=32)).eval()


def _rows(model: GPT, ids: list[int]) -> torch.Tensor:
    """log-softmax after each token of ids."""
    with torch.no_grad():
        logits = model(torch.tensor([ids]))
    logits = logits[0] if isinstance(logits, torch.Tensor) else logits.logits[0]
    return torch.log_softmax(logits.float(), dim=-1)


async def _post(state: ServeState, bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    state.worker.start()
    transport = httpx.ASGITransport(app=create_app(state))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        replies = [await client.post("/v1/completions", json=b) for b in bodies]
    state.worker.stop(timeout=30)
    for reply in replies:
        assert reply.status_code == 200, reply.text
    return [r.json() for r in replies]


def test_eos_that_ends_the_completion_is_scored_and_counted() -> None:
    model = _model()
    ids = list(PROMPT.encode())
    rows = _rows(model, ids)
    eos = int(rows[-1].argmax())  # the model's greedy next token is, by construction, its EOS
    codec = Codec(None, eos)
    engine = Engine(GPTAdapter(model, 2), 2, eos_id=eos, decode=codec.decode)
    state = ServeState(EngineThread(engine), codec, ServeConfig(slots=2, max_new_tokens=8), 32, "t")
    lm_eval = {"prompt": PROMPT, "max_tokens": 1, "echo": True, "logprobs": 1, "temperature": 0}
    plain = {"prompt": PROMPT, "max_tokens": 4, "temperature": 0}
    scored, unscored = asyncio.run(_post(state, [lm_eval, plain]))

    choice = scored["choices"][0]
    assert choice["text"] == PROMPT and choice["finish_reason"] == "stop"  # the text unchanged
    logprobs = choice["logprobs"]
    assert len(logprobs["tokens"]) == len(ids) + 1  # the echoed prompt, then the EOS
    assert logprobs["tokens"][-1] == ""
    assert logprobs["token_logprobs"][-1] == pytest.approx(float(rows[-1][eos]), abs=1e-5)
    assert logprobs["top_logprobs"][-1] == {"": pytest.approx(float(rows[-1][eos]), abs=1e-5)}
    assert logprobs["text_offset"][-1] == len(PROMPT)
    expected = rows[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
    assert torch.allclose(torch.tensor(logprobs["token_logprobs"][1:-1]), expected, atol=1e-5)
    assert scored["usage"]["completion_tokens"] == 1
    assert scored["usage"]["total_tokens"] == len(ids) + 1

    assert unscored["choices"][0]["text"] == "" and unscored["choices"][0]["logprobs"] is None
    assert unscored["usage"]["completion_tokens"] == 1  # the EOS, as OpenAI-style servers count


def test_lm_evals_own_reader_scores_the_whole_continuation() -> None:
    """local-completions' parse_logprobs on the reply: the continuation's last token counts (the
    issue's 28 choices lost it: no generated token followed the echoed prompt)."""
    pytest.importorskip("lm_eval")
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    model = _model()
    ids = list(PROMPT.encode())
    rows = _rows(model, ids)
    eos = int(rows[-1].argmax())
    codec = Codec(None, eos)
    engine = Engine(GPTAdapter(model, 1), 1, eos_id=eos, decode=codec.decode)
    serve = ServeConfig(slots=1, max_new_tokens=8)
    state = ServeState(EngineThread(engine), codec, serve, 32, "t", vocab=256)
    body = {"prompt": ids, "max_tokens": 1, "echo": True, "logprobs": 1, "temperature": 0}
    (reply,) = asyncio.run(_post(state, [body]))
    ctxlen = 3  # context "the", continuation " cat"
    [(logprob, _greedy)] = LocalCompletionsAPI.parse_logprobs(reply, ctxlens=[ctxlen])
    expected = rows[torch.arange(ctxlen - 1, len(ids) - 1), torch.tensor(ids[ctxlen:])].sum()
    assert logprob == pytest.approx(float(expected), abs=1e-5)
