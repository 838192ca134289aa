"""Replies in OpenAI's shapes: a completion or chat completion, its choices (prompt-major, n per
prompt), logprobs ({"tokens", "token_logprobs", "top_logprobs", "text_offset"}), usage, and the
server-sent-event chunks of a stream."""

from __future__ import annotations

import json
import time
from typing import Any

from launcher.serve.codec import Codec
from launcher.serve.engine import Request
from launcher.serve.logprobs import Scored
from launcher.serve.openai_params import Job


def usage(job: Job, requests: list[Request]) -> dict[str, int]:
    """Each prompt counted once (as OpenAI counts it with n > 1); every generated token, the
    end-of-sequence token that ended a completion included (as OpenAI-style servers count it)."""
    prompt = sum(len(ids) for ids in job.prompts)
    completion = sum(len(r.output_ids) + (r.stop_token is not None) for r in requests)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _kept(codec: Codec, request: Request) -> list[Scored]:
    """The scores of the tokens the returned text holds (a stop string cuts the text)."""
    scores, text = request.output_scores, request.text or ""
    if codec.decode(request.output_ids) == text:
        return scores
    for count in range(len(scores) + 1):
        if len(codec.decode(request.output_ids[:count])) >= len(text):
            return scores[:count]
    return scores


def _logprobs(
    codec: Codec, scores: list[Scored], offset: int, end: Scored | None = None
) -> dict[str, Any]:
    """`end`: the end-of-sequence token that ended the completion, listed last with the text ""
    (it adds nothing to the reply's text), as OpenAI-style servers list it."""
    ended = scores + ([end] if end is not None else [])

    def text(s: Scored, token: int) -> str:
        return "" if s is end and token == s.token else codec.token_text(token)

    tokens = [text(s, s.token) for s in ended]
    top: list[dict[str, float] | None] = []
    for s in ended:
        if s.logprob is None:
            top.append(None)
            continue
        alternatives: dict[str, float] = {}
        for token, logprob in ((s.token, s.logprob), *s.top):  # two tokens of one text: the first
            alternatives.setdefault(text(s, token), logprob)
        top.append(alternatives)
    offsets = []
    for piece in tokens:
        offsets.append(offset)
        offset += len(piece)
    return {
        "tokens": tokens,
        "token_logprobs": [s.logprob for s in ended],
        "top_logprobs": top,
        "text_offset": offsets,
    }


def _choice(job: Job, codec: Codec, index: int, request: Request) -> dict[str, Any]:
    prompt_text = job.prompt_texts[index // job.n] if job.echo else ""
    logprobs = None
    if job.logprobs is not None:
        scores = (request.prompt_scores if job.echo else []) + _kept(codec, request)
        start = 0 if job.echo else len(codec.decode(request.prompt_ids))
        logprobs = _logprobs(codec, scores, start, request.stop_score)
    return {
        "text": prompt_text + (request.text or ""),
        "index": index,
        "logprobs": logprobs,
        "finish_reason": request.finish_reason,
    }


def completion(
    job: Job, codec: Codec, name: str, ident: str, requests: list[Request]
) -> dict[str, Any]:
    return {
        "id": ident,
        "object": "text_completion",
        "created": int(time.time()),
        "model": name,
        "choices": [_choice(job, codec, i, r) for i, r in enumerate(requests)],
        "usage": usage(job, requests),
    }


def chat_completion(job: Job, name: str, ident: str, requests: list[Request]) -> dict[str, Any]:
    return {
        "id": ident,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": name,
        "choices": [
            {
                "index": i,
                "message": {"role": "assistant", "content": r.text or ""},
                "logprobs": None,
                "finish_reason": r.finish_reason,
            }
            for i, r in enumerate(requests)
        ],
        "usage": usage(job, requests),
    }


def chunk(
    chat: bool, name: str, ident: str, index: int, text: str | None, finish: str | None
) -> dict[str, Any]:
    """One stream event for one choice: text (None: the first chat event, its role), or the
    choice's end (finish set)."""
    if chat:
        if text is None:
            delta: dict[str, str] = {"role": "assistant", "content": ""}
        else:
            delta = {"content": text} if finish is None else {}
        choice: dict[str, Any] = {"index": index, "delta": delta, "logprobs": None}
    else:
        choice = {"index": index, "text": text or "", "logprobs": None}
    choice["finish_reason"] = finish
    return {
        "id": ident,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": int(time.time()),
        "model": name,
        "choices": [choice],
    }


def usage_chunk(chat: bool, name: str, ident: str, counts: dict[str, int]) -> dict[str, Any]:
    return {
        "id": ident,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": int(time.time()),
        "model": name,
        "choices": [],
        "usage": counts,
    }


def event(data: dict[str, Any] | str) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {text}\n\n".encode()


class StreamText:
    """The text of one choice as it grows, released only where it can no longer change: never
    the start of a stop string (it may be cut) nor an unfinished UTF-8 character."""

    def __init__(self, codec: Codec, stop: tuple[str, ...]) -> None:
        self.codec, self.stop, self.sent = codec, stop, ""

    def _safe(self, text: str) -> str:
        cuts = [text.find(s) for s in self.stop if s in text]
        if cuts:
            return text[: min(cuts)]
        held = 0
        for s in self.stop:
            for size in range(min(len(s) - 1, len(text)), 0, -1):
                if text.endswith(s[:size]):
                    held = max(held, size)
                    break
        text = text[: len(text) - held]
        return text.rstrip("\ufffd")

    def advance(self, ids: list[int]) -> str:
        safe = self._safe(self.codec.decode(ids))
        if not safe.startswith(self.sent) or len(safe) <= len(self.sent):
            return ""
        new, self.sent = safe[len(self.sent) :], safe
        return new

    def finish(self, final: str) -> str:
        return final[len(self.sent) :] if final.startswith(self.sent) else ""
