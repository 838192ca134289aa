"""The errors a user can fix. Each names the setting (or file) at fault and how to fix it."""

from __future__ import annotations


class LauncherError(Exception):
    """A problem the user can fix; printed as one line, exit status 2, no traceback."""

    exit_code = 2


class ConfigError(LauncherError):
    """A bad value or combination of config keys."""

    def __init__(self, keys: str | list[str], problem: str, fix: str = "") -> None:
        self.keys = [keys] if isinstance(keys, str) else list(keys)
        self.problem = problem
        self.fix = fix
        names = ", ".join(self.keys)
        text = f"{names}: {problem}"
        if fix:
            text += f" Fix: {fix}"
        super().__init__(text)


class DataError(LauncherError):
    """A missing, empty or malformed data file."""


class EnvironmentProblem(LauncherError):
    """The machine cannot run what the config asks (devices, tools on PATH)."""
