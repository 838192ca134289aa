"""Weights & Biases tracking (rank 0 only)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class WandbMode(str, Enum):
    offline = "offline"
    online = "online"
    disabled = "disabled"


@dataclass
class WandbConfig:
    """offline by default: files under <run dir>/wandb, no network or key needed."""

    mode: WandbMode = WandbMode.offline
    """offline: files under <run dir>/wandb (upload with `wandb sync`) | online | disabled."""
    project: str = "launcher"
    """W&B project the run belongs to."""
    entity: str | None = None
    """W&B team or user (null: your default entity)."""
    name: str | None = None
    """Run name (null: the run directory's name)."""
    group: str | None = None
    """Group (null: the sweep's name for sweep points)."""
    tags: list[str] = field(default_factory=list)
    """Labels shown with the run, e.g. [baseline,bf16]."""
    required: bool = True
    """A wandb failure stops the run at start; false: warn and train without it."""
