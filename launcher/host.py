"""Facts of the machine a command runs on that several floors need: the cores this process may use
and the launcher's cache directory. A leaf module (it imports nothing of the launcher), so that
the data checks, the memory plan, the runners and the server read them from one place."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "LAUNCHER_CACHE_DIR"


def local_cpu_count() -> int:
    """The cores this process may run on (its affinity, not the machine's total)."""
    return (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    )


def cache_dir() -> Path:
    """$LAUNCHER_CACHE_DIR, else $XDG_CACHE_HOME/launcher, else ~/.cache/launcher."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "launcher"
