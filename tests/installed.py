"""A module's optional packages, checked without importing them.

`pytest.importorskip("transformers")` at a module's top imports the package while the module is
collected, and every pytest-xdist worker collects every module: transformers, mlflow, openai,
datasets and lm-eval cost each worker seconds before its first test, on the run's busiest minute.
`require` asks the import system whether each package is there and skips the module if not; the
tests import the package where they use it.
"""

from __future__ import annotations

import importlib.util

import pytest


def require(*packages: str) -> None:
    """Skip the calling module (at collection) unless every package is installed."""
    missing = [name for name in packages if importlib.util.find_spec(name) is None]
    if missing:
        extras = "pip install -e '.[dev,hf,lora,serve,tracking,eval]'"
        pytest.skip(f"needs {', '.join(missing)} ({extras})", allow_module_level=True)
