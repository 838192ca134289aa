"""The adapter section: low-rank adapters (LoRA, through peft) on a frozen base model.

`adapter=none` (the default) trains every parameter; `adapter=lora` freezes the base that
`model=...` builds and trains small adapters beside the layers `adapter.targets` names (and, in
full, the modules `adapter.train_modules` names). Which modules the targets match is checked
against the model itself (launcher/adapters/targets.py), in `launch plan` and on every rank."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from launcher.config.checks import require_positive
from launcher.errors import ConfigError

ALL_LINEAR = "all-linear"
"""adapter.targets shorthand: every linear layer but the output head."""


class AdapterKind(str, Enum):
    none = "none"
    lora = "lora"


@dataclass
class AdapterConfig:
    """Which parameters train: all of them (none), or LoRA adapters on a frozen base (lora)."""

    name: AdapterKind = AdapterKind.none
    """none | lora (see docs/adapters.md)."""
    rank: int = 8
    """LoRA's rank r: each adapted layer W gets B @ A with A [r, in] and B [out, r]."""
    alpha: float = 16.0
    """LoRA's scale: the adapter's output is multiplied by alpha / rank."""
    dropout: float = 0.0
    """Dropout on the adapters' input (0 for exact comparisons)."""
    targets: list[str] = field(default_factory=lambda: [ALL_LINEAR])
    """Layers that get adapters: module names (a suffix such as attn.qkv or q_proj matches it in
    every block), regular expressions matched against whole names, or all-linear."""
    train_modules: list[str] = field(default_factory=list)
    """Modules trained in full beside the adapters (e.g. the embeddings: tok_emb, embed_tokens),
    named as targets are."""

    @property
    def enabled(self) -> bool:
        return self.name != AdapterKind.none

    def __post_init__(self) -> None:
        require_positive("adapter.rank", self.rank)
        require_positive("adapter.alpha", self.alpha)
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(
                "adapter.dropout",
                f"must be in [0, 1), got {self.dropout}.",
                "adapter.dropout=0.0 (or below 1).",
            )
        for key, names in (
            ("adapter.targets", self.targets),
            ("adapter.train_modules", self.train_modules),
        ):
            blank = [n for n in names if not str(n).strip()]
            if blank:
                raise ConfigError(
                    key, "holds an empty name.", f"give module names: {key}=[NAME,...]."
                )
        if self.enabled and not self.targets:
            raise ConfigError(
                "adapter.targets",
                "adapter=lora needs at least one layer to adapt.",
                f"adapter.targets=[{ALL_LINEAR}], or name layers: adapter.targets=[attn.qkv].",
            )

    def fingerprint(self) -> dict[str, object]:
        """What a resumed run must keep (launcher/checkpoint/compat.py)."""
        if not self.enabled:
            return {"adapter.name": self.name.value}
        return {
            "adapter.name": self.name.value,
            "adapter.rank": self.rank,
            "adapter.alpha": self.alpha,
            "adapter.dropout": self.dropout,
            "adapter.targets": list(self.targets),
            "adapter.train_modules": list(self.train_modules),
        }
