"""One request of the generation engine: what it asks for and, filled in by the engine, what it
got (tokens, text, scores, timings, why it ended)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from launcher.serve.logprobs import Scored
from launcher.serve.sampling import Sampling


@dataclass(eq=False)
class Request:
    prompt_ids: list[int]
    max_new_tokens: int
    sampling: Sampling = field(default_factory=Sampling)
    stop: tuple[str, ...] = ()
    """Strings that end the completion (not included in it)."""
    on_done: Callable[[Request], None] | None = None
    """Called (on the engine's thread) when the request retires."""
    tag: object = None
    """The caller's own reference (an input line, an HTTP request)."""
    logprobs: int | None = None
    """Score each generated token, with this many most likely alternatives (None: no scores)."""
    echo: bool = False
    """Score the prompt's tokens too (with `logprobs` alternatives, 0 when None)."""
    score_next: int | None = None
    """With echo: also score this token as the one after the prompt (in `next_score`): a
    scored continuation's last token without generating it (launcher/harness/model.py)."""
    on_token: Callable[[Request], None] | None = None
    """Called (on the engine's thread) after each generated token (streaming)."""
    cancelled: bool = False
    """Set from any thread when nobody waits for the answer: the engine drops the request at its
    next step and frees its slot."""
    # Filled in by the engine:
    output_ids: list[int] = field(default_factory=list)
    text: str | None = None
    """The completion, cut before a stop string (None: the engine has no decoder)."""
    finish_reason: str | None = None
    """"stop" (end-of-sequence token or stop string), "length" (token limit or context),
    "cancelled", or "error" (the engine failed it: see `error`)."""
    error: str | None = None
    """Why the engine failed the request ("ExceptionType: message")."""
    prompt_scores: list[Scored] = field(default_factory=list)
    output_scores: list[Scored] = field(default_factory=list)
    next_score: Scored | None = None
    """`score_next`'s score after the prompt."""
    stop_token: int | None = None
    """The end-of-sequence token that ended the completion: generated (OpenAI-style servers
    count and score it) though in neither `output_ids` nor the text."""
    stop_score: Scored | None = None
    """`stop_token`'s score, when `logprobs` was asked."""
    submitted_at: float = 0.0
    first_token_at: float | None = None
    finished_at: float | None = None
    slot: int | None = None

    @property
    def done(self) -> bool:
        return self.finish_reason is not None
