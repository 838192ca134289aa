"""The periodic validation loss."""

from __future__ import annotations

from dataclasses import dataclass

from launcher.errors import ConfigError


@dataclass
class EvalConfig:
    """A token-exact validation loss over held-out data, measured on every rank."""

    every: int = 0
    """Measure val_loss every N optimizer steps and after the last one (0: never)."""
    batches: int = 4
    """Global batches of held-out sequences per measurement (fewer if the held-out set is
    smaller)."""

    def __post_init__(self) -> None:
        if self.every < 0:
            raise ConfigError("eval.every", f"must be 0 (off) or more, got {self.every}.")
        if self.batches < 1:
            raise ConfigError("eval.batches", f"must be 1 or more, got {self.batches}.")
