"""Small validators shared by the config dataclasses."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from launcher.errors import ConfigError

ALLOW_NONFINITE = "allow_nonfinite"
"""Field metadata: `field(default=..., metadata={ALLOW_NONFINITE: True})` lets a float field hold
nan or inf; every other float field must be a finite number."""


def require_finite(section: str, obj: Any) -> None:
    """Every float field of the dataclass `obj` (and of dataclasses inside it) is a finite number.

    nan and inf pass `value > 0` style checks silently (every comparison with nan is false), then
    train to a NaN loss or fail deep inside torch; refused here, naming the key.
    """
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        key = f"{section}.{f.name}"
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            require_finite(key, value)
        elif (
            isinstance(value, float)
            and not math.isfinite(value)
            and not f.metadata.get(ALLOW_NONFINITE)
        ):
            example = f.default if isinstance(f.default, (int, float)) else None
            hint = f" (the default is {example})" if example is not None else ""
            if f.default is None:
                hint = " or null"
            raise ConfigError(
                key, f"must be a finite number, got {value}.", f"set {key} to a number{hint}."
            )


def require_positive(key: str, value: int | float | None, allow_none: bool = False) -> None:
    if value is None:
        if allow_none:
            return
        raise ConfigError(key, "must be set.", f"set {key}=<a positive number>.")
    if not value > 0:  # also refuses nan
        raise ConfigError(key, f"must be positive, got {value}.", f"set {key} to a value > 0.")


def require_non_negative(key: str, value: int | float) -> None:
    if not value >= 0:  # also refuses nan
        raise ConfigError(key, f"must be >= 0, got {value}.", f"set {key} to a value >= 0.")


def require_choice(key: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(key, f"unknown value {value!r}.", f"use one of: {', '.join(choices)}.")
