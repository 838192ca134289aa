"""The export section: the trained weights written in formats other tools load (`launch export`,
`export.at_end`)."""

from __future__ import annotations

from dataclasses import dataclass

from launcher.errors import ConfigError

DTYPES = ("fp32", "bf16", "fp16")


@dataclass
class ExportConfig:
    """`launch export RUN [--output DIR]` and the export after training."""

    dtype: str = "fp32"
    """Weights on disk: fp32 (the master weights, exactly), bf16 or fp16."""
    overwrite: bool = False
    """Replace a non-empty --output directory (refused without it)."""
    at_end: bool = False
    """`launch train`: export the final checkpoint into the run directory's export/."""
    merge: bool = False
    """An adapter run (adapter=lora): write the base with the adapters merged in (a directory
    that loads without peft) instead of a peft adapter directory."""

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ConfigError(
                "export.dtype", f"unknown dtype {self.dtype!r}.", "use fp32, bf16 or fp16."
            )
