"""Put on PYTHONPATH by tests/e2e/test_engines.py: every Python process of a run (the launcher,
torchrun's agent, each rank) writes the top-level packages in its sys.modules when it exits.

No production code knows about it; with LAUNCHER_IMPORT_PROBE unset it does nothing.
"""

from __future__ import annotations

import atexit
import os
import sys
from pathlib import Path

_PROBE_DIR = os.environ.get("LAUNCHER_IMPORT_PROBE")


def _write_modules() -> None:
    assert _PROBE_DIR is not None
    role = f"rank{os.environ['RANK']}" if "RANK" in os.environ else "process"
    packages = sorted({name.partition(".")[0] for name in list(sys.modules)})
    Path(_PROBE_DIR, f"{role}-{os.getpid()}.txt").write_text("\n".join(packages) + "\n")


if _PROBE_DIR:
    atexit.register(_write_modules)
