"""The built-in GPT's shape."""

from __future__ import annotations

from dataclasses import dataclass

from launcher.config.checks import require_finite, require_positive
from launcher.errors import ConfigError


@dataclass
class ModelConfig:
    """A decoder-only GPT with pre-norm blocks and byte-level tokens."""

    name: str = "tiny"
    """A label for logs; the shape below is what counts."""
    n_layer: int = 4
    """Transformer blocks."""
    n_head: int = 4
    """Attention heads per block; must divide d_model."""
    d_model: int = 128
    """Residual stream width."""
    seq_len: int = 32
    """Tokens per sequence (the context length)."""
    dropout: float = 0.0
    """Dropout on attention and residual paths (0 for exact comparisons)."""
    vocab_size: int = 256
    """Byte-level vocabulary; every built-in dataset uses bytes."""
    mlp_ratio: int = 4
    """Hidden width of the MLP as a multiple of d_model."""

    def __post_init__(self) -> None:
        require_finite("model", self)
        for key in ("n_layer", "n_head", "d_model", "seq_len", "vocab_size", "mlp_ratio"):
            require_positive(f"model.{key}", getattr(self, key))
        if self.d_model % self.n_head:
            raise ConfigError(
                ["model.d_model", "model.n_head"],
                f"d_model={self.d_model} is not divisible by n_head={self.n_head}.",
                "choose n_head that divides d_model.",
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError("model.dropout", f"must be in [0, 1), got {self.dropout}.")
        if self.vocab_size < 256:
            raise ConfigError(
                "model.vocab_size", "byte-level data needs at least 256 tokens.", "set 256."
            )
