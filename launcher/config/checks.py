"""Small validators shared by the config dataclasses."""

from __future__ import annotations

from launcher.errors import ConfigError


def require_positive(key: str, value: int | float | None, allow_none: bool = False) -> None:
    if value is None:
        if allow_none:
            return
        raise ConfigError(key, "must be set.", f"set {key}=<a positive number>.")
    if value <= 0:
        raise ConfigError(key, f"must be positive, got {value}.", f"set {key} to a value > 0.")


def require_non_negative(key: str, value: int | float) -> None:
    if value < 0:
        raise ConfigError(key, f"must be >= 0, got {value}.", f"set {key} to a value >= 0.")


def require_choice(key: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(key, f"unknown value {value!r}.", f"use one of: {', '.join(choices)}.")
