"""Activation-checkpoint (recompute) granularity."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from launcher.config.checks import require_positive


class AcPolicy(str, Enum):
    none = "none"
    full = "full"
    every_n = "every_n"
    sqrt = "sqrt"
    selective = "selective"
    auto = "auto"
    """Chosen by the plan: the cheapest granularity that fits train.memory_budget."""

    @classmethod
    def granularities(cls) -> list[AcPolicy]:
        """The policies a model can run (auto resolves to one of them before launch)."""
        return [p for p in cls if p != cls.auto]


@dataclass
class AcConfig:
    """Which activations are recomputed in backward instead of kept from forward."""

    policy: AcPolicy = AcPolicy.none
    """none | full | every_n | sqrt | selective | auto (see docs/recompute.md, docs/memory.md)."""
    every_n: int = 2
    """every_n: recompute every n-th block."""
    offload: bool = False
    """Keep saved activations in pinned host memory (GPU only; a notice on CPU)."""

    def __post_init__(self) -> None:
        require_positive("ac.every_n", self.every_n)
