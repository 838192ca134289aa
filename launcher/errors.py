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


class VocabTooSmall(DataError):
    """Token ids at or past the model's vocabulary. The fix named is the built-in model's key;
    a user model's check (launcher/models/probe.py) names its own."""

    def __init__(
        self, problem: str, needed: int, alternative: str, tokenizer: bool = False
    ) -> None:
        self.problem, self.needed, self.alternative = problem, needed, alternative
        self.tokenizer = tokenizer
        """The data has a tokenizer: model.vocab_size=auto would follow it."""
        auto = " (or auto: the tokenizer's)" if tokenizer else ""
        super().__init__(f"{problem} Fix: set model.vocab_size={needed}{auto}, or {alternative}")


class EnvironmentProblem(LauncherError):
    """The machine cannot run what the config asks (devices, tools on PATH)."""
