"""The parameters of /v1/completions and /v1/chat/completions, checked against OpenAI's limits:
each one this server implements becomes part of a Job; one it does not implement is a 400 naming
it (never silently ignored); an unknown key is a 400 too, and so is a request of more sequences
(n x prompts) than the server can ever hold at once, or messages the chat template refuses."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from launcher.config.serve import ServeConfig
from launcher.serve.body import check_text
from launcher.serve.codec import ChatTemplateError, Codec
from launcher.serve.engine import Request
from launcher.serve.openai_errors import ApiError
from launcher.serve.openai_values import flag, integer, number, shown, stop_strings, stream_options
from launcher.serve.sampling import Sampling

MAX_N = 128
MAX_LOGPROBS = 5
COMMON = {"model", "max_tokens", "temperature", "top_p", "top_k", "n", "stream", "stream_options"}
COMMON |= {"stop", "seed", "user", "logit_bias", "presence_penalty", "frequency_penalty"}
COMPLETION_KEYS = COMMON | {"prompt", "logprobs", "echo", "best_of", "suffix"}
CHAT_KEYS = COMMON | {"messages", "max_completion_tokens", "logprobs", "top_logprobs"}
CHAT_ROLES = ("system", "user", "assistant")


@dataclass
class Limits:
    """What the server was started with (the parameters' bounds)."""

    serve: ServeConfig
    model_name: str
    prompt_limit: int
    vocab: int | None


@dataclass
class Job:
    prompts: list[list[int]]
    prompt_texts: list[str]
    n: int
    max_tokens: int
    sampling: Sampling
    stop: tuple[str, ...]
    logprobs: int | None
    echo: bool
    stream: bool
    include_usage: bool

    def requests(self) -> list[Request]:
        """One engine request per choice, in OpenAI's choice order (prompt-major); choice j of a
        prompt samples with seed + j."""
        return [
            Request(
                ids,
                self.max_tokens,
                dataclasses.replace(self.sampling, seed=self.sampling.seed + j),
                stop=self.stop,
                logprobs=self.logprobs,
                echo=self.echo,
            )
            for ids in self.prompts
            for j in range(self.n)
        ]


def _refuse_unknown(body: dict[str, Any], known: set[str]) -> None:
    for key in body:
        if key not in known:
            raise ApiError(f"unknown parameter {shown(key)}: this server does not take it.", key)
    bias = body.get("logit_bias")
    if bias:
        raise ApiError("logit_bias is not supported by this server; leave it out.", "logit_bias")
    for key in ("presence_penalty", "frequency_penalty"):
        if body.get(key) not in (None, 0, 0.0):
            raise ApiError(f"{key} is not supported by this server; leave it out or 0.", key)


def _model(body: dict[str, Any], limits: Limits) -> None:
    name = body.get("model")
    if name is not None and name != limits.model_name:
        raise ApiError(
            f"the model {shown(name)} does not exist here; this server serves "
            f"{limits.model_name!r} (GET /v1/models).",
            "model",
            status=404,
            code="model_not_found",
        )


def _ids(prompt: list[Any], limits: Limits) -> list[int]:
    top = limits.vocab
    if top is None:
        raise ApiError("this model takes text prompts only (its vocabulary is unknown).", "prompt")
    if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < top for t in prompt):
        raise ApiError(f"token ids must be integers in [0, {top}).", "prompt")
    return list(prompt)


def _fits(prompts: int, n: int, limits: Limits) -> None:
    """A request of more sequences than slots + queue could never be served: a 400, not a 503
    that a client would retry for ever."""
    serve = limits.serve
    most = serve.slots + serve.queue
    if prompts * n > most:
        raise ApiError(
            f"this request needs {prompts * n} sequences ({prompts} prompt(s) x n={n}); this "
            f"server holds at most {most} at once (serve.slots={serve.slots} + "
            f"serve.queue={serve.queue}), so it could never be served: send fewer prompts or "
            "a smaller n.",
            "n" if n > 1 else "prompt",
            code="too_many_sequences",
        )


def _prompts(body: dict[str, Any], codec: Codec, limits: Limits, n: int) -> list[list[int]]:
    """A string, a list of strings, a list of token ids or a list of lists of token ids."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        items: list[Any] = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        items = [prompt]
    elif isinstance(prompt, list) and prompt:
        items = prompt
    else:
        raise ApiError(
            '"prompt" must be a string, a list of strings, a list of token ids or a list of '
            "lists of token ids (non-empty).",
            "prompt",
        )
    _fits(len(items), n, limits)
    out = []
    for item in items:
        if isinstance(item, str):
            check_text(item, "prompt")
            out.append(codec.encode(item))
        elif isinstance(item, list):
            out.append(_ids(item, limits))
        else:
            raise ApiError('a list "prompt" holds strings or lists of token ids only.', "prompt")
    return out


def _check_lengths(prompts: list[list[int]], limits: Limits) -> None:
    for ids in prompts:
        if not ids:
            raise ApiError("a prompt encodes to no tokens.", "prompt")
        if len(ids) > limits.prompt_limit:
            raise ApiError(
                f"the prompt is {len(ids)} tokens; this server accepts at most "
                f"{limits.prompt_limit}.",
                "prompt",
                code="context_length_exceeded",
            )


def _sampling(body: dict[str, Any], serve: ServeConfig, seed: int) -> Sampling:
    return Sampling(
        temperature=number(body, "temperature", serve.temperature, 0.0, 2.0),
        top_k=integer(body, "top_k", serve.top_k, 0, 1 << 31),
        top_p=number(body, "top_p", serve.top_p, 1e-9, 1.0),
        seed=integer(body, "seed", seed, -(1 << 63), (1 << 63) - 1 - MAX_N),
    )


def _max_tokens(body: dict[str, Any], key: str, serve: ServeConfig, low: int) -> int:
    value = integer(body, key, serve.max_new_tokens, low, 1 << 31)
    if value > serve.max_new_tokens:
        raise ApiError(
            f"{key} is {value}; this server generates at most {serve.max_new_tokens} "
            "(serve.max_new_tokens).",
            key,
        )
    return value


def completion_job(body: dict[str, Any], codec: Codec, limits: Limits, seed: int) -> Job:
    _refuse_unknown(body, COMPLETION_KEYS)
    _model(body, limits)
    if body.get("suffix") is not None:
        raise ApiError("suffix is not supported by this server; leave it out.", "suffix")
    n = integer(body, "n", 1, 1, MAX_N)
    best_of = body.get("best_of")
    if best_of is not None and best_of != n:
        raise ApiError("best_of is not supported by this server; leave it out.", "best_of")
    echo = flag(body, "echo")
    logprobs = body.get("logprobs")
    if logprobs is not None:
        logprobs = integer(body, "logprobs", 0, 0, MAX_LOGPROBS)
    stream, include_usage = stream_options(body)
    if stream and (echo or logprobs is not None):
        raise ApiError("echo and logprobs are not supported with stream=true.", "stream")
    prompts = _prompts(body, codec, limits, n)
    _check_lengths(prompts, limits)
    return Job(
        prompts,
        [codec.decode(ids) for ids in prompts] if echo else [],
        n,
        _max_tokens(body, "max_tokens", limits.serve, 0 if echo else 1),
        _sampling(body, limits.serve, seed),
        stop_strings(body),
        logprobs,
        echo,
        stream,
        include_usage,
    )


def _content(message: Any, index: int) -> dict[str, str]:
    where = f"messages[{index}]"
    if not isinstance(message, dict) or message.get("role") not in CHAT_ROLES:
        raise ApiError(f'{where} must be {{"role": system|user|assistant, "content"}}.', where)
    if set(message) - {"role", "content", "name"}:
        extra = shown(sorted(set(message) - {"role", "content", "name"})[0]).strip("'")
        raise ApiError(f"{where}.{extra} is not supported by this server.", f"{where}.{extra}")
    content = message.get("content")
    if isinstance(content, list):  # the parts form: text parts only
        text = [isinstance(p, dict) and p.get("type") == "text" for p in content]
        if not all(text) or not all(isinstance(p.get("text", ""), str) for p in content):
            raise ApiError(f"{where}.content: only text parts (strings) are supported.", where)
        content = "".join(p.get("text", "") for p in content)
    if not isinstance(content, str):
        raise ApiError(f"{where}.content must be a string.", where)
    check_text(content, where)
    return {"role": message["role"], "content": content}


def chat_job(body: dict[str, Any], codec: Codec, limits: Limits, seed: int) -> Job:
    _refuse_unknown(body, CHAT_KEYS)
    _model(body, limits)
    for key in ("logprobs", "top_logprobs"):
        if body.get(key) not in (None, False):
            raise ApiError(f"{key} is not supported for chat by this server; leave it out.", key)
    if codec.chat is None:
        raise ApiError(
            "this model's tokenizer has no chat template, so it cannot take chat messages; use "
            "/v1/completions with a prompt.",
            "messages",
            code="no_chat_template",
        )
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError('"messages" must be a non-empty list of messages.', "messages")
    n = integer(body, "n", 1, 1, MAX_N)
    _fits(1, n, limits)
    try:
        text = codec.render_chat([_content(m, i) for i, m in enumerate(messages)])
    except ChatTemplateError as exc:  # the template's own raise_exception, or its mistake
        raise ApiError(
            f"the chat template refused these messages: {exc}", "messages", code="chat_template"
        ) from None
    prompts = [codec.encode(text)]
    _check_lengths(prompts, limits)
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    stream, include_usage = stream_options(body)
    return Job(
        prompts,
        [],
        n,
        _max_tokens(body, key, limits.serve, 1),
        _sampling(body, limits.serve, seed),
        stop_strings(body),
        None,
        False,
        stream,
        include_usage,
    )
