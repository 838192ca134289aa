"""What the trackers beside wandb receive: the run's config as flat parameters (credentials
redacted) and the numbers of a metrics line."""

from __future__ import annotations

import sys
from typing import Any

from launcher.config.load import to_plain
from launcher.config.root import RootConfig
from launcher.secrets import redactor_for


def run_params(cfg: RootConfig, derived: dict[str, Any]) -> dict[str, Any]:
    """The run's config and derived values as flat `section.key` parameters, every credential
    redacted by the rules that clean config.yaml (and wandb's config)."""
    config = {**to_plain(cfg), "derived": derived}
    clean = redactor_for([config, list(sys.argv)]).data(config)
    flat: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict) and value:
            for key, inner in value.items():
                walk(f"{prefix}.{key}" if prefix else str(key), inner)
        else:
            flat[prefix] = value

    walk("", clean)
    return flat


def numbers(line: dict[str, Any]) -> dict[str, float]:
    """The numeric values of a metrics line or summary (booleans, text and nulls left out)."""
    return {
        key: float(value)
        for key, value in line.items()
        if isinstance(value, int | float) and not isinstance(value, bool) and key != "step"
    }
