"""Generation and serving from a trained run (`launch generate`, `launch serve`)."""

from __future__ import annotations

from dataclasses import dataclass

from launcher.config.checks import require_finite, require_non_negative, require_positive
from launcher.errors import ConfigError


@dataclass
class ServeConfig:
    """The generation engine's slots and decoding defaults, and the HTTP server's limits."""

    slots: int = 8
    """Requests decoded at once, each with its own KV cache (continuous batching)."""
    max_new_tokens: int = 64
    """Tokens generated per request unless the request asks for fewer."""
    temperature: float = 0.0
    """0: greedy; above 0: sampled with this temperature."""
    top_k: int = 0
    """Sample among the k most likely tokens (0: all)."""
    top_p: float = 1.0
    """Sample among the smallest set of tokens whose probability reaches p (1.0: all)."""
    seed: int = 0
    """Base seed of sampled decoding; each request draws from its own generator."""
    host: str = "127.0.0.1"
    """Address `launch serve` listens on (loopback unless set)."""
    port: int = 8000
    """Port `launch serve` listens on."""
    queue: int = 64
    """Requests waiting for a slot before the server answers 503 with Retry-After (a request of
    more than slots + queue sequences, n x prompts, can never fit: 400)."""
    max_prompt_tokens: int = 0
    """Longest prompt accepted, in tokens (0: the model's context length)."""
    model_name: str = ""
    """The model's name in the API (/v1/models, each reply's "model"; a request naming another
    is refused). Empty: the run directory's name."""
    max_body_bytes: int = 1 << 20
    """Largest request body `launch serve` reads (413 above it, before reading)."""
    header_timeout_seconds: float = 20.0
    """A connection whose request headers are not complete this long after it opened (or after
    the request's first byte) is closed."""
    body_timeout_seconds: float = 60.0
    """A request body not fully received this long after its headers: 408, connection closed."""
    keep_alive_seconds: float = 5.0
    """An idle kept-alive connection is closed after this long (uvicorn's timeout_keep_alive)."""

    def __post_init__(self) -> None:
        require_finite("serve", self)
        require_positive("serve.slots", self.slots)
        require_positive("serve.max_new_tokens", self.max_new_tokens)
        require_non_negative("serve.temperature", self.temperature)
        require_non_negative("serve.top_k", self.top_k)
        require_non_negative("serve.queue", self.queue)
        require_non_negative("serve.max_prompt_tokens", self.max_prompt_tokens)
        require_positive("serve.max_body_bytes", self.max_body_bytes)
        for key in ("header_timeout_seconds", "body_timeout_seconds", "keep_alive_seconds"):
            require_positive(f"serve.{key}", getattr(self, key))
        if self.model_name != self.model_name.strip():
            raise ConfigError(
                "serve.model_name",
                f"must not start or end with spaces, got {self.model_name!r}.",
                "serve.model_name=my-model.",
            )
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError("serve.top_p", f"must be in (0, 1], got {self.top_p}.")
        if not -(1 << 62) <= self.seed <= 1 << 62:  # + request or line numbers: within 64 bits
            raise ConfigError("serve.seed", f"must be within +-2**62, got {self.seed}.")
        if not 0 < self.port < 65536:
            raise ConfigError("serve.port", f"must be a port number (1-65535), got {self.port}.")
