"""The command lines of `launch generate` and `launch serve`: positionals, flags, and the
`serve.*` (and `train.device`) overrides applied on top of the run's own serve section."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any

from launcher.config.serve import ServeConfig
from launcher.config.suggest import did_you_mean, suggestions
from launcher.errors import ConfigError

DEVICE_KEY = "train.device"
DEVICES = ("auto", "cpu", "cuda")


@dataclass
class CommandLine:
    positionals: list[str] = field(default_factory=list)
    output: str | None = None
    help: bool = False
    overrides: dict[str, str] = field(default_factory=dict)
    """key -> value as typed."""


def parse_argv(argv: list[str], command: str, takes_output: bool) -> CommandLine:
    line = CommandLine()
    args = iter(argv)
    for arg in args:
        if arg in ("-h", "--help"):
            line.help = True
        elif takes_output and (arg in ("-o", "--output") or arg.startswith("--output=")):
            value = arg.split("=", 1)[1] if "=" in arg else next(args, None)
            if not value:
                raise ConfigError("--output", "needs a file name.", "--output FILE.")
            line.output = value
        elif arg.startswith("-"):
            known = "-h/--help" + (", --output FILE" if takes_output else "")
            raise ConfigError(arg, f"unknown option of launch {command}.", f"use {known}.")
        elif "=" in arg:
            key, value = arg.split("=", 1)
            line.overrides[key.lstrip("+")] = value
        else:
            line.positionals.append(arg)
    return line


def _serve_keys() -> dict[str, type]:
    hints = typing.get_type_hints(ServeConfig)
    return {f"serve.{f.name}": hints[f.name] for f in dataclasses.fields(ServeConfig)}


def _typed(key: str, value: str, kind: type) -> Any:
    if kind is str:
        return value
    try:
        return kind(value)
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise ConfigError(key, f"{value!r} is not {what}.") from None


def apply_overrides(
    serve: ServeConfig, overrides: dict[str, str], command: str
) -> tuple[ServeConfig, str]:
    """(the serve section with the overrides, the device asked for). Unknown keys: one error
    with the nearest names."""
    keys = _serve_keys()
    device = "auto"
    changes: dict[str, Any] = {}
    for key, value in overrides.items():
        if key == DEVICE_KEY:
            if value not in DEVICES:
                raise ConfigError(key, f"unknown device {value!r}.", "use auto, cpu or cuda.")
            device = value
        elif key in keys:
            changes[key.removeprefix("serve.")] = _typed(key, value, keys[key])
        else:
            near = suggestions(key, [*keys, DEVICE_KEY])
            raise ConfigError(
                key,
                f"launch {command} takes no such key.",
                f"{did_you_mean(near)}it takes {', '.join(sorted(keys))} and {DEVICE_KEY}.",
            )
    # Validation lives in ServeConfig.__post_init__; replace() runs it.
    return dataclasses.replace(serve, **changes), device
