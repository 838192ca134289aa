"""The parameters of /v1/completions and /v1/chat/completions, checked against OpenAI's limits:
each one this server implements becomes part of a Job; one it does not implement is a 400 naming
it (never silently ignored); an unknown key is a 400 too."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from launcher.config.serve import ServeConfig
from launcher.serve.body import check_text
from launcher.serve.codec import Codec
from launcher.serve.engine import Request
from launcher.serve.openai_errors import ApiError
from launcher.serve.sampling import Sampling

MAX_N = 128
MAX_LOGPROBS = 5
MAX_STOP = 4
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


def _number(body: dict[str, Any], key: str, default: float, low: float, high: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ApiError(f"{key} must be a number, got {value!r}.", key)
    if not low <= value <= high:
        raise ApiError(f"{key} must be in [{low}, {high}], got {value}.", key)
    return float(value)


def _integer(body: dict[str, Any], key: str, default: int, low: int, high: int) -> int:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(f"{key} must be an integer, got {value!r}.", key)
    if not low <= value <= high:
        raise ApiError(f"{key} must be between {low} and {high}, got {value}.", key)
    return value


def _flag(body: dict[str, Any], key: str) -> bool:
    value = body.get(key)
    if value is not None and not isinstance(value, bool):
        raise ApiError(f"{key} must be true or false, got {value!r}.", key)
    return bool(value)


def _refuse_unknown(body: dict[str, Any], known: set[str]) -> None:
    for key in body:
        if key not in known:
            raise ApiError(f"unknown parameter {key!r}: this server does not take it.", key)
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
            f"the model {name!r} does not exist here; this server serves {limits.model_name!r} "
            "(GET /v1/models).",
            "model",
            status=404,
            code="model_not_found",
        )


def _stop(body: dict[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str) and stop:
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise ApiError('"stop" must be a string or a list of non-empty strings.', "stop")
    if len(stop) > MAX_STOP:
        raise ApiError(f'"stop" holds at most {MAX_STOP} strings, got {len(stop)}.', "stop")
    return tuple(stop)


def _stream(body: dict[str, Any]) -> tuple[bool, bool]:
    stream = _flag(body, "stream")
    options = body.get("stream_options")
    if options is None:
        return stream, False
    if not stream:
        raise ApiError("stream_options is only allowed with stream=true.", "stream_options")
    if not isinstance(options, dict) or set(options) - {"include_usage"}:
        raise ApiError('stream_options takes only {"include_usage": true|false}.', "stream_options")
    return stream, _flag(options, "include_usage")


def _ids(prompt: list[Any], limits: Limits) -> list[int]:
    top = limits.vocab
    if top is None:
        raise ApiError("this model takes text prompts only (its vocabulary is unknown).", "prompt")
    if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < top for t in prompt):
        raise ApiError(f"token ids must be integers in [0, {top}).", "prompt")
    return list(prompt)


def _prompts(body: dict[str, Any], codec: Codec, limits: Limits) -> list[list[int]]:
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
        temperature=_number(body, "temperature", serve.temperature, 0.0, 2.0),
        top_k=_integer(body, "top_k", serve.top_k, 0, 1 << 31),
        top_p=_number(body, "top_p", serve.top_p, 1e-9, 1.0),
        seed=_integer(body, "seed", seed, -(1 << 63), (1 << 63) - 1 - MAX_N),
    )


def _max_tokens(body: dict[str, Any], key: str, serve: ServeConfig, low: int) -> int:
    value = _integer(body, key, serve.max_new_tokens, low, 1 << 31)
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
    n = _integer(body, "n", 1, 1, MAX_N)
    best_of = body.get("best_of")
    if best_of is not None and best_of != n:
        raise ApiError("best_of is not supported by this server; leave it out.", "best_of")
    echo = _flag(body, "echo")
    logprobs = body.get("logprobs")
    if logprobs is not None:
        logprobs = _integer(body, "logprobs", 0, 0, MAX_LOGPROBS)
    stream, include_usage = _stream(body)
    if stream and (echo or logprobs is not None):
        raise ApiError("echo and logprobs are not supported with stream=true.", "stream")
    prompts = _prompts(body, codec, limits)
    _check_lengths(prompts, limits)
    return Job(
        prompts,
        [codec.decode(ids) for ids in prompts] if echo else [],
        n,
        _max_tokens(body, "max_tokens", limits.serve, 0 if echo else 1),
        _sampling(body, limits.serve, seed),
        _stop(body),
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
        extra = sorted(set(message) - {"role", "content", "name"})[0]
        raise ApiError(f"{where}.{extra} is not supported by this server.", f"{where}.{extra}")
    content = message.get("content")
    if isinstance(content, list):  # the parts form: text parts only
        if not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
            raise ApiError(f"{where}.content: only text parts are supported.", where)
        content = "".join(str(p.get("text", "")) for p in content)
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
    prompts = [codec.encode(codec.render_chat([_content(m, i) for i, m in enumerate(messages)]))]
    _check_lengths(prompts, limits)
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    stream, include_usage = _stream(body)
    return Job(
        prompts,
        [],
        _integer(body, "n", 1, 1, MAX_N),
        _max_tokens(body, key, limits.serve, 1),
        _sampling(body, limits.serve, seed),
        _stop(body),
        None,
        False,
        stream,
        include_usage,
    )
