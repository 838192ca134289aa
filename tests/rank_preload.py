"""What tests/spawned.py's forkserver imports once for every rank it forks. One module that
tolerates each import failing: multiprocessing's own preload list skips only ImportError, and any
other error there (an optional library failing at import) would kill the forkserver and every
rank group of the worker, not just the rows that need that library."""

from __future__ import annotations

import contextlib
import importlib

MODULES = (
    "torch",
    "torch._dynamo",  # every optimizer step imports it
    "launcher.worker.run",
    "tests.harness",
    # What the groups' rows build, where installed.
    "deepspeed",
    "transformers.models.llama.modeling_llama",
    "transformers.models.gpt2.modeling_gpt2",
)

for name in MODULES:
    # A failure here is the rank's to report, where it imports the module again and uses it.
    with contextlib.suppress(Exception):
        importlib.import_module(name)
